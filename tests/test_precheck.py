"""jaxmem/precheck.py: a typo is answered before jax or the model loads, with the closest valid name.

Each command runs in one child process whose import system ends the process (exit 97) the moment
anything imports jax or flax, and whose model file ends it (exit 98) when it is imported: an error
raised after either would not come back as exit 2. Not a timing test: benchmarks/precheck_times.py
times the same commands."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jaxmem import precheck
from jaxmem.errors import UserError

ROOT = Path(__file__).resolve().parent.parent

# Ends the process when jax/flax is imported: installed before jaxmem is.
BLOCK_JAX = """
import os, sys
class _NoJax:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "flax"):
            sys.stderr.write(f"IMPORTED {name}\\n"); sys.stderr.flush(); os._exit(97)
        return None
sys.meta_path.insert(0, _NoJax())
"""

MODEL = "import os\nos._exit(98)   # imported: the check came too late\ndef workload(): ...\n"


def _cli_cases(tmp: Path) -> dict[str, list[str]]:
    model = str(tmp / "model.py")
    fifo = tmp / "pipe.py"
    os.mkfifo(fifo)
    (tmp / "models").mkdir()
    (tmp / "models" / "llama.py").write_text(MODEL)
    return {
        "missing": ["analyze", str(tmp / "nosuch.py")],
        "missing, a sibling close": ["analyze", str(tmp / "models" / "lama.py")],
        "a fifo": ["analyze", str(fifo)],
        "gpu": ["analyze", model, "--gpu", "h1000"],
        "gpu alias": ["analyze", model, "--gpu", "a6001"],
        "mesh role": ["analyze", model, "--mesh", "fsdpp=8"],
        "remat": ["analyze", model, "--remat", "fulll"],
        "layout": ["analyze", model, "--layout", "fsdpp"],
        "precision": ["analyze", model, "--precision", "bf61"],
        "optimizer": ["analyze", model, "--optimizer", "adamv"],
        "cpu devices": ["analyze", model, "--gpu", "cpu", "--mesh", "data=16"],
        "hosts": ["analyze", model, "--gpu", "h100", "--mesh", "data=6", "--hosts", "4"],
        "too many devices": ["analyze", model, "--mesh", "data=100000000"],
        "compare missing": ["compare", str(tmp / "nosuch.py"), "--layouts", "dp,fsdp"],
        "compare grid mesh": ["compare", model, "--meshes", "data=2;fsdpp=2"],
        "compare grid hosts": ["compare", model, "--gpu", "h100", "--meshes", "data=8;data=6", "--hosts", "4"],
        "advise gpu": ["advise", model, "--gpu", "h1000"],
        "verify missing": ["verify", str(tmp / "nosuch.py")],
    }


EXPECTED = {
    "missing": "model file not found",
    "missing, a sibling close": "did you mean " + os.path.join("{tmp}", "models", "llama.py") + "?",
    "a fifo": "is not a regular file",
    "gpu": "unknown GPU 'h1000' (did you mean h100?)",
    "gpu alias": "(did you mean a6000?)",
    "mesh role": "axis 'fsdpp' has no role (did you mean fsdp?)",
    "remat": "(did you mean full?)",
    "layout": "(did you mean fsdp?)",
    "precision": "(did you mean bf16?)",
    "optimizer": "unknown optimizer 'adamv' (did you mean adam?)",
    "cpu devices": "the mesh needs 16 CPU devices but XLA_FLAGS forces 8",
    "hosts": "--hosts 4 does not divide the 6 devices",
    "too many devices": "--mesh has 100,000,000 devices",
    "compare missing": "model file not found",
    "compare grid mesh": "(did you mean fsdp?)",
    "compare grid hosts": "--hosts 4 does not divide the 6 devices",
    "advise gpu": "(did you mean h100?)",
    "verify missing": "model file not found",
}


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory):
    """Every case through the program's own entry (jaxmem.cli.entry), one child process each."""
    tmp = tmp_path_factory.mktemp("precheck")
    (tmp / "model.py").write_text(MODEL)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    out = {}
    for name, argv in _cli_cases(tmp).items():
        code = BLOCK_JAX + f"sys.argv = ['jaxmem', *{argv!r}]\nfrom jaxmem.cli import entry\nentry()\n"
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                           cwd=tmp)
        out[name] = (p.returncode, p.stdout + p.stderr)
    return tmp, out


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_typo_is_exit_2_with_the_closest_name_before_jax_or_the_model_loads(cli_results, case):
    tmp, results = cli_results
    code, text = results[case]
    assert "IMPORTED" not in text and code not in (97, 98), (case, code, text)
    assert code == 2 and "Traceback" not in text, (case, code, text)
    assert EXPECTED[case].format(tmp=tmp) in text, (case, text)


def test_the_api_answers_a_typo_before_jax_loads(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    code = BLOCK_JAX + textwrap.dedent(f"""
        import json, jaxmem
        out = []
        for call in (lambda: jaxmem.analyze({str(model)!r}, gpu="h1000"),
                     lambda: jaxmem.analyze({str(tmp_path / "nosuch.py")!r}),
                     lambda: jaxmem.compare({str(model)!r}, meshes=["data=2", "fsdpp=2"]),
                     lambda: jaxmem.advise({str(model)!r}, gpu="h100", mesh="fsdpp=8")):
            try:
                call()
                out.append("no error")
            except jaxmem.UserError as e:
                out.append(str(e))
        print(json.dumps(out))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    gpu, missing, grid, mesh = json.loads(p.stdout)
    assert "did you mean h100?" in gpu and "model file not found" in missing
    assert "did you mean fsdp?" in grid and "did you mean fsdp?" in mesh


def test_the_gpu_catalogue_and_the_checks_import_no_jax():
    code = ("import sys, jaxmem.precheck, jaxmem.compiler.targets as t; "
            "print(len(t.CATALOGUE), sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and p.stdout.split(" ", 1)[1].strip() == "[]", p.stdout + p.stderr


def test_cache_diff_and_gpus_answer_without_loading_jax(tmp_path):
    """`jaxmem cache`, `diff` and `gpus` read files and tables only: jax, flax and the CUDA plugin stay unloaded
    (they took 3 s of a 0.4 s answer when the commands' jax side was loaded for them)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAXMEM_CACHE": str(tmp_path / "cache")}
    report = tmp_path / "r.json"
    report.write_text((ROOT / "tests" / "fixtures" / "golden" / "jax-0.10.2" / "mlp-data8-fsdp.json").read_text())
    for args in (["cache", "--json"], ["gpus"], ["diff", str(report), str(report)]):
        p = subprocess.run([sys.executable, "-X", "importtime", "-m", "jaxmem.cli", *args], capture_output=True,
                           text=True, timeout=120, env=env)
        loaded = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
        assert p.returncode == 0 and "jaxmem.session" in loaded, (args, p.stdout[-500:], p.stderr[-2000:])
        assert not loaded & {"jax", "jaxlib", "flax"}, (args, sorted(loaded & {"jax", "jaxlib", "flax"}))


def test_an_existing_folder_or_json_is_left_to_the_loader(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    precheck.model_file(tmp_path)                      # a config.json folder is a model too
    precheck.model_file(tmp_path / "config.json")
    with pytest.raises(UserError, match="model file not found"):
        precheck.model_file(tmp_path / "nope.json")


def test_a_path_message_says_what_the_path_is(tmp_path):
    # issue 47: a dangling link was answered "did you mean" the same path; a folder whose config.json links to
    # /dev/zero was called a directory
    (tmp_path / "llama.py").symlink_to(tmp_path / "gone" / "llama.py")
    with pytest.raises(UserError) as e:
        precheck.model_file(tmp_path / "llama.py")
    assert str(e.value) == (f"{tmp_path / 'llama.py'} is a symbolic link to {tmp_path / 'gone' / 'llama.py'}, which "
                            "does not exist; fix the link, or give the model file itself")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "config.json").symlink_to("/dev/zero")
    with pytest.raises(UserError, match=r"^the folder .*folder holds config.json, which is not a regular file "
                                        r"\(a link into /dev\); give a folder whose config.json is"):
        precheck.model_file(tmp_path / "folder")
    with pytest.raises(UserError, match=r"^/dev/null is not a regular file \(a device\); give the model file"):
        precheck.model_file("/dev/null")


def test_no_suggestion_when_nothing_is_close():
    with pytest.raises(UserError) as e:
        precheck.gpu("zzzzzz")
    assert "did you mean" not in str(e.value) and "Known:" in str(e.value)
    assert precheck.did_you_mean("h1000", ["h100", "h200"]) == " (did you mean h100?)"


@pytest.mark.parametrize("flags,mesh", [("", "data=64"), ("--xla_force_host_platform_device_count=16", "data=16"),
                                        ("--xla_force_host_platform_device_count=16", "data=8")])
def test_a_cpu_mesh_the_forced_devices_hold_passes(monkeypatch, flags, mesh):
    monkeypatch.setenv("XLA_FLAGS", flags)
    precheck.mesh(mesh, gpu_name="cpu")
    precheck.mesh("data=6", gpu_name="h100", hosts=3)   # --hosts dividing the mesh
    precheck.mesh("data=6", gpu_name="local", hosts=4)  # --hosts is the catalogue's topology, not local's

"""A recipe's XLA_FLAGS reach the deviceless compile, and the compile cache keeps them apart.

GPU recipes (MaxText, JAX-Toolbox, the DGXC benchmarks) set XLA_FLAGS such as
``--xla_disable_hlo_passes=rematerialization``. XLA parses the variable once per process; jax
copies the parse into every compile's options, which the compile child receives serialized.
Each run here is a fresh CLI process, as a user's would be.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest


ROOT = pathlib.Path(__file__).resolve().parent.parent
# The tiny Llama with ~77 GiB of activations on one H100: past the ~80% of the card (63 GiB) that XLA:GPU's
# rematerialization pass budgets, so the pass runs (and fails: the warning) unless switched off.
ARGS = ["analyze", "models/llama.py", "--arg", "preset=tiny", "--arg", "seq_len=2048", "--batch", "192",
        "--gpu", "h100", "--mesh", "data=1", "--layout", "dp", "--json", "--no-explain"]
FLAG = "--xla_disable_hlo_passes=rematerialization"


def _analyze(cache_dir, flags: str | None, *extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAXMEM_CACHE"] = str(cache_dir)
    if flags is not None:
        env["XLA_FLAGS"] = flags
    out = subprocess.run([sys.executable, "-m", "jaxmem.cli", *ARGS, *extra], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode in (0, 3), out.stderr[-2000:]   # 3: it does not fit, which is the point
    return json.loads(out.stdout)


def _kinds(report: dict) -> set[str]:
    return {w["kind"] for w in report["warnings"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cache")
    plain = _analyze(d, None)                 # compiled, stored
    flagged = _analyze(d, FLAG)               # same program, same cache: must compile again
    flagged_fresh = _analyze(d, FLAG, "--no-cache")
    return plain, flagged, flagged_fresh


def test_a_flag_changes_the_deviceless_compile(runs):
    plain, _, flagged_fresh = runs
    # XLA's rematerialization ran (and could not fit the program) without the flag, not with it
    assert "xla_remat_failed" in _kinds(plain)
    assert "xla_remat_failed" not in _kinds(flagged_fresh)
    assert plain["xla"]["temp"] != flagged_fresh["xla"]["temp"]
    assert plain["per_device_peak_bytes"] != flagged_fresh["per_device_peak_bytes"]


def test_the_cache_does_not_answer_a_flagged_compile_with_an_unflagged_entry(runs):
    plain, flagged, flagged_fresh = runs
    assert flagged == flagged_fresh           # the flagged answer, whether from the cache or not
    assert flagged["xla"] != plain["xla"]


# One analysis through the API; "late" sets XLA_FLAGS after XLA has parsed it (a library user
# changing os.environ mid-process). Both modes trace the same program (the same call stack), so
# only the key's view of the flags can tell their entries apart.
_MID_PROCESS = """
import json, os, sys
from jaxmem.compiler import cache
if sys.argv[1] == "late":
    cache._debug_options()                   # XLA parses XLA_FLAGS (unset) here
    os.environ["XLA_FLAGS"] = sys.argv[2]    # too late: the compile below runs without it
from jaxmem.pipeline import AnalyzeOptions, analyze_file
opts = AnalyzeOptions(gpu="h100", mesh="data=1", layout="dp", batch=192, explain=False,
                      model_args=(("preset", "tiny"), ("seq_len", 2048)))
r = analyze_file("models/llama.py", opts)
print(json.dumps({"xla": r.xla, "hit": r.timings["cache_hit"]}))
"""


def _api(cache_dir, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAXMEM_CACHE"] = str(cache_dir)
    if mode == "early":
        env["XLA_FLAGS"] = FLAG
    out = subprocess.run([sys.executable, "-c", _MID_PROCESS, mode, FLAG], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_xla_flags_set_mid_process_do_not_poison_the_cache(runs, tmp_path):
    plain, _, flagged_fresh = runs
    late = _api(tmp_path, "late")
    assert late["xla"] == plain["xla"] and late["hit"] == 0.0   # compiled without the flag, and stored
    early = _api(tmp_path, "early")
    assert early["hit"] == 0.0                                  # that entry does not answer ...
    assert early["xla"] == flagged_fresh["xla"]                 # ... a compile that has the flag


def test_the_forced_host_device_count_is_not_part_of_the_fingerprint():
    # it sizes the CPU client only (the mesh's devices are keyed apart), as in _xla_flags
    code = "from jaxmem.compiler import cache; print(cache._debug_options())"
    prints = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                             env={**os.environ, "XLA_FLAGS": f, "JAX_PLATFORMS": "cpu"}).stdout.strip()
              for f in ("", "--xla_force_host_platform_device_count=8", FLAG)}
    assert len(prints) == 2 and "" not in prints

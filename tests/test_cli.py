"""The command line: exit codes, JSON contract, one-line errors, documented commands."""
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from jaxmem import cli

FIX = __import__("pathlib").Path(__file__).parent / "fixtures"
from helpers import MLP_SMALL as MLP  # noqa: E402


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)


def test_every_command_is_documented_with_an_example():
    for name, command in cli.main.commands.items():
        help_text = invoke(name, "--help").output
        assert "Example" in help_text, name
        assert command.help and len(command.help) > 40, name


def test_analyze_json_contract_and_exit_code_when_it_fits():
    r = invoke("analyze", MLP, "--gpu", "h100", "--mesh", "data=8", "--layout", "fsdp", "--json", "--no-explain")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    for key in ("per_device_peak_bytes", "breakdown", "target", "mesh", "layout", "fits"):
        assert key in d
    for key in ("params", "optimizer_state", "gradients", "batch", "activations_and_temporaries",
                "outputs_not_aliased", "generated_code", "runtime_overhead"):
        assert key in d["breakdown"]
    assert sum(d["breakdown"].values()) == d["per_device_peak_bytes"]
    assert d["target"]["gpu"] == "h100" and d["target"]["devices"] == 8 and d["target"]["memory_bytes"] == 84942979072
    assert d["mesh"] == {"data": 8} and d["layout"] == "fsdp" and d["fits"] is True


def test_exit_code_3_when_it_does_not_fit():
    r = invoke("analyze", MLP, "--gpu", "rtx-a6000", "--mem-fraction", "0.0001", "--no-explain")
    assert r.exit_code == 3
    assert "DOES NOT FIT" in r.output


@pytest.mark.parametrize("args,message", [
    (["analyze", FIX / "nope.py"], "model file not found"),
    (["analyze", FIX / "broken_syntax.py"], "SyntaxError"),
    (["analyze", FIX / "no_workload.py"], "defines no `workload()`"),
    (["analyze", MLP, "--gpu", "v100"], "unknown GPU 'v100' (did you mean h100?). Known: a100-40g, a100-80g"),
    (["analyze", MLP, "--mesh", "data=8", "--batch", "12"], "not divisible"),
    (["analyze", MLP, "--mesh", "data=8", "--hosts", "3"], "does not divide"),
    (["analyze", MLP, "--mesh", "data=8", "--layout", "tp"], "needs a model axis"),
    (["analyze", MLP, "--optimizer", "adamax"], "unknown optimizer 'adamax'"),
    (["analyze", MLP, "--arg", "nokey"], "KEY=VALUE"),
])
def test_user_errors_exit_2_with_one_message(args, message):
    r = CliRunner().invoke(cli.main, [str(a) for a in args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args,where", [
    ((), "initializing the model through loss(model, batch) failed"),
    (("--arg", "custom_step=true"), "tracing the training step failed"),
], ids=["model init", "custom step traced"])
def test_a_model_error_keeps_the_lines_that_explain_it(args, where):
    r = CliRunner().invoke(cli.main, ["analyze", str(FIX / "scan_carry_dtype.py"), "--gpu", "cpu", "--no-explain",
                                      *args])
    assert r.exit_code == 2, r.output
    assert f"{where}: TypeError: scan body function carry input and carry output must have equal types" in r.output
    # jax names the culprit after its first line
    assert "has type bfloat16[4,8] but the corresponding output carry component has type float32[4,8]" in r.output
    assert "Traceback" not in r.output


def test_a_very_long_model_error_is_cut_and_says_so():
    r = CliRunner().invoke(cli.main, ["analyze", str(FIX / "raises_long.py")])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert lines[0].endswith("workload() raised: ValueError: line 1: the table has a bad row (raises_long.py, line 5)")
    assert lines[1:25] == [f"line {i}: the table has a bad row" for i in range(2, 26)]
    assert lines[25].startswith("[message cut: 175 more lines") and len(lines) == 26
    assert "Traceback" not in r.output


def test_batch_that_no_batch_leaf_can_take_is_refused_before_compiling(monkeypatch):
    scalars = str(FIX / "scalar_batch.py")
    assert invoke("analyze", scalars, "--gpu", "cpu", "--no-explain").exit_code == 0   # a scalar batch is fine
    from jaxmem.compiler import compiled

    def no_compile(*a, **k):
        raise AssertionError("compiled although --batch was refused")

    monkeypatch.setattr(compiled, "compile_step", no_compile)
    r = CliRunner().invoke(cli.main, ["analyze", scalars, "--gpu", "cpu", "--batch", "16"])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: --batch 16: the workload's batch has no leaf with a batch dimension")
    assert "batch['scale']: float32[], batch['x']: float32[]" in r.output and "Drop --batch" in r.output
    assert "Traceback" not in r.output


def test_gpus_lists_the_catalogue():
    r = invoke("gpus", "--json")
    names = {g["name"]: g for g in json.loads(r.output)}
    assert {"a100-80g", "h100", "h200", "b200", "rtx-a6000"} <= set(names)
    assert names["h200"]["memory_bytes"] == 151397597184


def test_gpus_piped_to_a_file_is_not_cut_at_80_columns():
    # off a terminal rich falls back to 80 columns, which cut `NVIDIA A100-SXM4-80GB` to `A100-SXM4-80…`
    env = {k: v for k, v in __import__("os").environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-m", "jaxmem.cli", "gpus"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "NVIDIA A100-SXM4-80GB" in out.stdout and "a100, a100-sxm-80g" in out.stdout, out.stdout
    assert "…" not in out.stdout


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_gpus_to_a_full_device_is_exit_2_like_the_other_commands(as_json):
    # issue 47: `jaxmem gpus > /dev/full` printed a traceback and exited 1 where analyze, cache and doctor say exit 2
    with open("/dev/full", "wb") as full:
        out = subprocess.run([sys.executable, "-m", "jaxmem.cli", "gpus", *(["--json"] if as_json else [])],
                             stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr == "error: cannot write the output (stdout): No space left on device\n"


def test_console_script_runs_as_a_real_process():
    # a fresh interpreter: the CLI must set up host devices and the CUDA switch itself
    out = subprocess.run([sys.executable, "-m", "jaxmem.cli", "analyze", MLP, "--gpu", "cpu", "--mesh", "data=4",
                          "--json", "--no-explain"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["target"]["devices"] == 4


def test_compare_grid_json():
    r = invoke("compare", MLP, "--gpu", "h100", "--mesh", "data=8", "--layouts", "dp,fsdp,tp", "--batches", "64,128",
               "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert len(rows) == 6
    ok = [x for x in rows if not x["error"]]
    assert len(ok) == 4 and all(x["fits"] for x in ok)
    # tp needs a model axis: a row with the reason, not a crash
    assert all("model axis" in x["error"] for x in rows if x["choice"]["layout"] == "tp")
    by = {(x["choice"]["layout"], x["choice"]["batch"]): x["per_device_peak_bytes"] for x in ok}
    assert by[("fsdp", 64)] < by[("dp", 64)]

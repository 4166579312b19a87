"""The analytic train-state model must agree exactly with XLA's argument bytes."""
import pytest

from conftest import build_step
from jaxmem.program import train_state
from jaxmem.pipeline import AnalyzeOptions, analyze_file

FIX = __import__("pathlib").Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("gpu,layout,mesh,optimizer,precision", [
    ("cpu", "dp", "data=8", "adamw", "fp32"),
    ("cpu", "fsdp", "data=8", "adafactor", "fp32"),
    ("h100", "fsdp", "data=8", "lion", "bf16-pure"),
    ("h100", "fsdp_tp", "data=4,model=2", "momentum", "bf16"),
    ("a100-80g", "tp", "data=2,model=4", "sgd", "fp32"),
    ("b200", "fsdp", "data=8", "adam", "bf16"),
])
def test_analytic_arguments_equal_compiled(gpu, layout, mesh, optimizer, precision):
    r = analyze_file(str(FIX / "annotated.py"), AnalyzeOptions(gpu=gpu, mesh=mesh, layout=layout, optimizer=optimizer,
                                                               precision=precision, explain=False))
    assert r.state_check["analytic_argument_bytes"] == r.state_check["compiled_argument_bytes"]


def test_fsdp_divides_state_by_the_data_axis():
    dp = analyze_file(str(FIX / "mlp_small.py"), AnalyzeOptions(gpu="h100", mesh="data=8", layout="dp", explain=False))
    fs = analyze_file(str(FIX / "mlp_small.py"), AnalyzeOptions(gpu="h100", mesh="data=8", layout="fsdp", explain=False))
    # the 16-wide head and biases stay replicated; the kernels split 8 ways
    assert dp.breakdown["params"] / fs.breakdown["params"] > 6
    assert dp.breakdown["optimizer_state"] / fs.breakdown["optimizer_state"] > 6


def test_optimizer_families_have_their_slot_counts():
    got = {}
    for opt in ("sgd", "momentum", "adamw", "lion"):
        r = analyze_file(str(FIX / "mlp_small.py"), AnalyzeOptions(gpu="h100", mesh="data=1", layout="dp", optimizer=opt,
                                                                   explain=False))
        got[opt] = r.breakdown["optimizer_state"] / r.breakdown["params"]
    assert got["sgd"] < 0.01 and abs(got["momentum"] - 1) < 0.01 and abs(got["lion"] - 1) < 0.01
    assert abs(got["adamw"] - 2) < 0.01


def test_precision_sets_storage_dtypes():
    def run(precision):
        return analyze_file(str(FIX / "mlp_small.py"), AnalyzeOptions(gpu="h100", layout="dp", precision=precision,
                                                                      batch=1024, explain=False))

    f32, pure, mixed = run("fp32"), run("bf16-pure"), run("bf16")
    assert pure.breakdown["params"] * 2 == f32.breakdown["params"]
    assert mixed.breakdown["params"] == f32.breakdown["params"]          # fp32 master weights
    # gradients (analytic: without the buffer assignment the report does not split them from temp)
    g = {p: _analytic_gradients(p) for p in ("fp32", "bf16-pure", "bf16")}
    assert g["bf16"] == g["fp32"] > 0                                    # grads of fp32 params
    assert g["bf16-pure"] * 2 == g["fp32"]
    # bf16 compute halves the activations
    assert mixed.breakdown["activations_and_temporaries"] < 0.7 * f32.breakdown["activations_and_temporaries"]


def test_classic_rule():
    assert train_state.classic_bytes_per_param("adamw", "bf16") == 16
    assert train_state.classic_bytes_per_param("adam", "fp32") == 16
    assert train_state.classic_bytes_per_param("sgd", "fp32") == 8


def _analytic_gradients(precision: str) -> int:
    _, built = build_step(str(FIX / "mlp_small.py"), gpu="h100", layout="dp", precision=precision, batch=1024)
    return train_state.summarize(built.leaves).gradients

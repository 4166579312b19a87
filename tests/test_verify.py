"""`jaxmem verify` / `jaxmem calibrate`, and the classic analytic estimate they are compared with."""

import json

import pytest
from click.testing import CliRunner

from jaxmem.truth import classic, verify
from jaxmem.compiler import runtime, targets
from jaxmem.cli import main
from jaxmem.program.workload import load_workload

# ~230 MB measured on one host device: 12.6 M params of AdamW state (200 MB) + the step's
# temporaries. The signal dwarfs the runtime's ~14 MB and the noise of a loaded 2-core machine.
MLP_ARGS = ["--arg", "preset=base", "--arg", "hidden=2048", "--arg", "n_layers=4", "--arg", "batch_size=256"]


@pytest.fixture
def shipped_overhead(monkeypatch, tmp_path):
    """analyze and verify use the shipped overhead.json, not the user's calibration."""
    monkeypatch.setenv("JAXMEM_CALIBRATION", str(tmp_path / "none.json"))


def test_verify_a_small_mlp_within_tolerance(models_dir, shipped_overhead):
    r = CliRunner().invoke(main, ["verify", str(models_dir / "mlp.py"), *MLP_ARGS, "--gpu", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    for key in ("predicted_peak_bytes", "measured_peak_bytes", "relative_error", "per_device", "method"):
        assert key in out
    assert out["measured_peak_bytes"] > 150e6
    assert abs(out["relative_error"]) < 0.10
    assert out["relative_error"] == pytest.approx(
        (out["predicted_peak_bytes"] - out["measured_peak_bytes"]) / out["measured_peak_bytes"])
    (dev,) = out["per_device"]
    assert set(dev) == {"device", "predicted_peak_bytes", "measured_peak_bytes", "relative_error"}
    m = out["method"]
    assert m["backend"] == "cpu" and m["devices"] == 1 and m["baseline_bytes"] > 0
    assert "clear_refs" in m["description"] and "split" in m
    # the number compared is analyze's own prediction for --gpu cpu
    a = CliRunner().invoke(main, ["analyze", str(models_dir / "mlp.py"), *MLP_ARGS, "--gpu", "cpu", "--json",
                                  "--no-explain"])
    assert json.loads(a.output)["per_device_peak_bytes"] == out["predicted_peak_bytes"]


def test_verify_refuses_what_this_machine_cannot_hold(models_dir, monkeypatch):
    monkeypatch.setattr(verify, "mem_available", lambda: 200 << 20)
    r = CliRunner().invoke(main, ["verify", str(models_dir / "mlp.py"), "--arg", "preset=base", "--gpu", "cpu"])
    assert r.exit_code == 2
    assert "cannot hold the case" in r.output and "needs about" in r.output and "MemAvailable" in r.output


def test_verify_needs_a_local_backend(models_dir):
    if targets.local_gpu_count():
        pytest.skip("a GPU is attached")
    r = CliRunner().invoke(main, ["verify", str(models_dir / "mlp.py"), "--arg", "preset=tiny", "--gpu", "h100"])
    assert r.exit_code == 2 and "no GPU" in r.output


def test_calibrate_stores_the_cpu_overhead(monkeypatch, tmp_path):
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("JAXMEM_CALIBRATION", str(path))
    monkeypatch.setattr(verify, "CPU_CALIBRATION_DEVICES", (1, 2))
    monkeypatch.setattr(verify, "CALIBRATION_SIZES", ({"width": 256, "batch": 64},))
    r = CliRunner().invoke(main, ["calibrate", "--gpu", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    entry = json.loads(path.read_text())["cpu"]
    assert entry["measured_at"] and "jaxmem calibrate" in entry["source"] and "jax 0.10.2" in entry["source"]
    # the runtime's own cost: a few MB to a few tens of MB per process on CPU
    assert 1 << 20 < entry["per_process_bytes"] + 2 * entry["in_pool_bytes"] < 200 << 20
    cpu2 = targets.Target("cpu", "cpu", "cpu", None, False, (None, None))
    rt = runtime.model(cpu2)
    assert rt.calibrated and rt.in_pool_bytes == entry["in_pool_bytes"] + entry["per_process_bytes"] // 2
    assert rt.terms[0].source == entry["source"]


# ---------------------------------------------------------------- the classic estimate


def test_korthikanti_formula():
    d = classic.TransformerDims(layers=1, heads=32, hidden=4096, vocab=0, seq=2048)
    s, b, h, a = 2048, 1, 4096, 32
    output = 4 * s * b * h
    assert classic.korthikanti_bytes(d, b, 1, "bf16", "none") == int(s * b * h * (34 + 5 * a * s / h)) + output
    assert classic.korthikanti_bytes(d, b, 8, "bf16", "none") == int(
        s * b * h * (10 + 24 / 8 + 5 * a * s / (h * 8)) + output / 8)
    assert classic.korthikanti_bytes(d, b, 1, "bf16", "full") == 2 * s * b * h + output
    # fp32: the 2-byte activations double, the 1-byte dropout masks do not
    assert classic.korthikanti_bytes(d, b, 1, "fp32", "none") == int(
        s * b * h * (66 + 9 * a * s / h)) + 2 * output


def test_classic_estimate_reads_the_model_config(models_dir):
    wl = load_workload(models_dir / "gpt2.py", preset="tiny")
    est = classic.estimate(wl, param_count=1000, mesh="data=8", layout="fsdp", precision="fp32", optimizer=None,
                           remat="none", batch_size=16)
    assert est.state_bytes == 1000 * 16 // 8
    assert "Korthikanti" in est.rule and "L=2" in est.rule and "s=64" in est.rule and "b=2" in est.rule
    vit = load_workload(models_dir / "vit.py", preset="tiny")
    assert classic.model_config(vit).patch_size == 8  # from the closure of `lambda rngs: ViT(cfg, rngs=rngs)`
    mlp = load_workload(models_dir / "mlp.py", preset="tiny")
    est = classic.estimate(mlp, param_count=1000, mesh="data=1", layout="dp", precision="fp32", optimizer="sgd",
                           remat="none")
    # torchsummary's rule: 2 x (3 hidden Dense outputs of 8 x 256 + the head's 8 x 10) x 4 bytes
    assert est.state_bytes == 8000 and est.activation_bytes == 2 * (3 * 8 * 256 + 8 * 10) * 4

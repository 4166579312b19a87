"""`jaxmem doctor`: on this machine (no GPU) and against a fake of the NVML calls."""

import json
import os

import pynvml
import jax
import jaxlib
import pytest
from click.testing import CliRunner

from jaxmem.cli import main
from jaxmem.compiler import targets
from jaxmem.truth import doctor
from nvml_fake import GiB, FakeNvml

CHECKS = ["gpus", "versions", "smoke", "memory_settings", "calibration", "deviceless"]


def _no_gpu_here():
    if any(os.path.exists(p) for p in doctor.DRIVER_PATHS) or targets.local_gpu_count():
        pytest.skip("this machine has an NVIDIA driver or GPU")


@pytest.fixture
def clean_memory_env(monkeypatch):
    for k in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION",
              "XLA_PYTHON_CLIENT_ALLOCATOR", "TF_GPU_ALLOCATOR"):
        monkeypatch.delenv(k, raising=False)


def test_without_a_gpu_doctor_says_so_and_proves_analyze_works(clean_memory_env, monkeypatch, tmp_path):
    _no_gpu_here()
    monkeypatch.setenv("JAXMEM_CALIBRATION", str(tmp_path / "calibration.json"))
    r = CliRunner().invoke(main, ["doctor", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["schema"] == "jaxmem.doctor/1" and out["ok"] and out["exit_code"] == 0
    checks = {c["name"]: c for c in out["checks"]}
    assert list(checks) == CHECKS
    assert checks["gpus"]["status"] == "warn" and "no NVIDIA GPU" in checks["gpus"]["summary"]
    assert "deviceless compilation" in checks["gpus"]["summary"]
    assert checks["smoke"]["status"] == "skip"
    # the versions the CUDA plugin would check are still shown, from the plugin's own extension
    v = checks["versions"]
    assert v["status"] == "skip" and "needs an NVIDIA driver" in v["summary"]
    assert v["details"]["packages"]["jax"] == jax.__version__ and v["details"]["packages"]["jaxlib"] == jaxlib.__version__
    assert v["details"]["cuda_components"]["cudnn"]["installed"] > 0
    assert checks["memory_settings"]["status"] == "pass" and "75%" in checks["memory_settings"]["summary"]
    assert checks["calibration"]["status"] == "pass" and "none yet" in checks["calibration"]["summary"]
    d = checks["deviceless"]
    assert d["status"] == "pass" and set(d["details"]["compiled"]) == set(targets.CATALOGUE)
    assert all(c["peak_bytes"] > 0 for c in d["details"]["compiled"].values())


def test_require_gpu_fails_without_one_and_the_text_report_gives_the_fix(clean_memory_env):
    _no_gpu_here()
    r = CliRunner().invoke(main, ["doctor", "--require-gpu", "--no-compile"])
    assert r.exit_code == doctor.EXIT_CHECK_FAILED == 3, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("FAIL  gpus") and "fix: run on a machine with an NVIDIA GPU" in lines[1]
    assert lines[-1] == "not ok: gpus failed (exit 3)"
    help_text = " ".join(CliRunner().invoke(main, ["doctor", "--help"]).output.split())
    assert "Exit code: 0 when no check fails, 3 when one fails, 2 on a user error" in help_text


def test_gpus_seen_through_nvml(monkeypatch):
    FakeNvml([dict(name="NVIDIA H100 80GB HBM3", cc=(9, 0), total=80 * GiB, used=1 * GiB)] * 2,
             driver="575.57.08").install(monkeypatch)
    c = doctor.check_gpus()
    assert c.status == "pass" and c.summary == "2 GPU(s) (NVIDIA H100 80GB HBM3), driver 575.57.08"
    g = c.details["gpus"][1]
    assert g == {"index": 1, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GiB,
                 "memory_used_bytes": 1 * GiB, "compute_capability": "9.0"}


def test_the_silent_fall_back_to_cpu_fails_the_smoke_test(monkeypatch, clean_memory_env):
    # NVML (faked) sees two H100s, but this machine's jax has no GPU: the real smoke step runs on the CPU
    _no_gpu_here()
    FakeNvml([dict(name="NVIDIA H100 80GB HBM3", cc=(9, 0), total=80 * GiB)] * 2).install(monkeypatch)
    d = doctor.diagnose(deviceless=False)
    smoke = d.check("smoke")
    assert smoke.status == "fail" and "jax runs on the CPU although NVML sees 2 GPU(s)" in smoke.summary
    assert smoke.details["result"]["params_on"] == ["cpu"] and smoke.details["result"]["grads_on"] == ["cpu"]
    assert "JAX_PLATFORMS" in smoke.fix
    # and the CUDA plugin cannot check its libraries without a driver: on a GPU machine that fails too
    assert d.check("versions").status == "fail"
    assert d.exit_code == 3 and not d.ok


def test_a_driver_nvml_cannot_reach_fails(monkeypatch, tmp_path):
    FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND).install(monkeypatch)
    marker = tmp_path / "version"
    marker.write_text("NVRM version: 575.57.08")
    monkeypatch.setattr(doctor, "DRIVER_PATHS", (str(marker),))
    c = doctor.check_gpus()
    assert c.status == "fail" and "libnvidia-ml.so.1" in c.summary and "--gpus all" in c.fix


def test_a_driver_that_is_not_loaded_fails(monkeypatch):
    FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED).install(monkeypatch)
    c = doctor.check_gpus()
    assert c.status == "fail" and "Driver Not Loaded" in c.summary and "nvidia-smi" in c.fix


@pytest.mark.parametrize("env,status,words", [
    ({}, "pass", "JAX reserves 75% of NVIDIA H100 80GB HBM3 (80.0 GiB) = 60.0 GiB when it starts"),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "abc"}, "fail", "XLA_PYTHON_CLIENT_MEM_FRACTION='abc' is not a number"),
    ({"XLA_CLIENT_MEM_FRACTION": "5"}, "fail", "XLA_CLIENT_MEM_FRACTION=5 is outside (0, 1]"),
    ({"XLA_CLIENT_MEM_FRACTION": "0.98"}, "warn", "leaves 2% of the card outside JAX's pool"),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, "pass", "grows on demand up to 75%"),
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, "pass", "no pool"),
])
def test_memory_settings_and_what_they_mean(env, status, words):
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GiB}]
    c = doctor.check_memory_settings(gpus, env={**env, "XLA_FLAGS": "--xla_gpu_enable_nccl_user_buffers=true --foo"})
    assert c.status == status and words in c.summary, c.summary
    assert c.details["settings"]["XLA_FLAGS (memory-related)"] == ["--xla_gpu_enable_nccl_user_buffers=true"]


def test_versions_are_formatted_as_each_library_encodes_them():
    assert doctor._fmt_version(12090) == "12.9"
    assert doctor._fmt_version(92800, "cudnn") == "9.28.0"
    assert doctor._fmt_version(120903, "cublas") == "12.9.3"
    assert doctor._fmt_version(12510, "cusparse") == "12.5.10"


def test_the_calibration_check(monkeypatch, tmp_path):
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("JAXMEM_CALIBRATION", str(path))
    h100 = [{"name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GiB}]
    c = doctor.check_calibration(h100)
    assert c.status == "warn" and "no calibration for NVIDIA H100 80GB HBM3" in c.summary
    assert c.fix == "jaxmem calibrate --gpu local"
    path.write_text(json.dumps({"NVIDIA H100 80GB HBM3": {"in_pool_bytes": 1, "out_of_pool_bytes": 2, "source": "m",
                                                          "measured_at": "2026-11-30"}}))
    c = doctor.check_calibration(h100)
    assert c.status == "pass" and "NVIDIA H100 80GB HBM3 (2026-11-30)" in c.summary
    path.write_text(json.dumps({"cpu": {"in_pool_bytes": -1, "out_of_pool_bytes": 0, "source": "x"}}))
    c = doctor.check_calibration(h100)
    assert c.status == "fail" and str(path) in c.summary and "in_pool_bytes = -1" in c.summary

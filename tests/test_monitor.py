"""NVML monitoring (jaxmem.truth.monitor) against a fake of the NVML calls."""

import os
import time

import pynvml
import pytest

from jaxmem.truth import monitor
from nvml_fake import GiB, FakeNvml

HW_SLOWDOWN = pynvml.nvmlClocksEventReasonHwSlowdown
POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap
IDLE = pynvml.nvmlClocksEventReasonGpuIdle


def _gpu(**kw):
    return dict(name="NVIDIA H100 80GB HBM3", cc=(9, 0), total=80 * GiB, **kw)


def test_summary_is_min_median_max_over_the_samples(monkeypatch):
    fake = FakeNvml([_gpu(util=[10, 50, 90], used=[1 * GiB, 3 * GiB, 2 * GiB], power_mw=[100_000, 300_000, 200_000],
                          temp=[40, 60, 50], reasons=IDLE)]).install(monkeypatch)
    mon = monitor.Monitor([0], interval=3600)  # only the start and stop samples, plus one taken by hand
    with mon:
        mon.sample()
    s = mon.summary()
    assert s["available"] and s["samples"] == 3 and s["gpus"] == [0]
    assert s["metrics"]["utilization_pct"] == {"min": 10, "median": 50, "max": 90}
    assert s["metrics"]["memory_used_bytes"] == {"min": 1 * GiB, "median": 2 * GiB, "max": 3 * GiB}
    assert s["metrics"]["power_w"] == {"min": 100.0, "median": 200.0, "max": 300.0}
    assert s["metrics"]["temperature_c"] == {"min": 40, "median": 50, "max": 60}
    assert not s["throttled"] and s["throttle_reasons"] == {}   # idle is not throttling
    assert fake.calls["init"] == 1 and fake.calls["shutdown"] == 1
    assert [x["utilization_pct"] for x in mon.trace()] == [10, 50, 90]


def test_the_thread_samples_while_the_work_runs(monkeypatch):
    FakeNvml([_gpu(util=50), _gpu(util=70)]).install(monkeypatch)
    with monitor.Monitor([0, 1], interval=0.01) as mon:
        time.sleep(0.3)
    s = mon.summary()
    assert s["samples"] >= 2 * 5 and s["window_s"] >= 0.25     # both GPUs, many samples
    assert s["metrics"]["utilization_pct"] == {"min": 50, "median": 60.0, "max": 70}
    assert {x["gpu"] for x in mon.trace()} == {0, 1}


def test_throttling_is_flagged_with_its_reasons(monkeypatch):
    FakeNvml([_gpu(reasons=[0, HW_SLOWDOWN | POWER_CAP, POWER_CAP])]).install(monkeypatch)
    mon = monitor.Monitor([0], interval=3600)
    with mon:
        mon.sample()
    s = mon.summary()
    assert s["throttled"] and s["throttle_reasons"] == {"hw_slowdown": 1, "sw_power_cap": 2}
    w = monitor.throttle_warning(s)
    assert "hw_slowdown (1 of 3 samples)" in w and "sw_power_cap (2 of 3 samples)" in w
    assert "throttled: sw_power_cap, hw_slowdown" in monitor.monitor_lines(s)[-1]


def test_a_reading_the_card_does_not_support_leaves_the_others(monkeypatch):
    FakeNvml([_gpu(util=30, power_mw=pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED))]).install(monkeypatch)
    with monitor.Monitor([0], interval=3600) as mon:
        pass
    s = mon.summary()
    assert s["metrics"]["power_w"] is None and s["metrics"]["utilization_pct"]["max"] == 30
    assert "power n/a" in monitor.monitor_lines(s)[2]


def test_no_nvml_means_no_monitoring_not_an_error(monkeypatch):
    FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND).install(monkeypatch)
    with monitor.Monitor([0]) as mon:
        pass
    s = mon.summary()
    assert s == {"available": False, "error": "NVML: NVML Shared Library Not Found", "samples": 0}
    assert monitor.monitor_lines(s) == ["GPU monitoring: unavailable (NVML: NVML Shared Library Not Found)"]
    assert monitor.device_used_bytes([0]) is None and monitor.process_used_bytes([0]) is None


def test_process_and_device_memory(monkeypatch):
    me = os.getpid()
    FakeNvml([_gpu(used=5 * GiB, procs=[(me, 3 * GiB), (1, 2 * GiB)]),
              _gpu(used=1 * GiB, procs=[(me, 1 * GiB)])]).install(monkeypatch)
    assert monitor.device_used_bytes([0, 1]) == [5 * GiB, 1 * GiB]
    assert monitor.process_used_bytes([0, 1]) == [3 * GiB, 1 * GiB]
    assert monitor.process_used_bytes([0], pid=12345) is None   # NVML does not see the process (containers)


def test_cuda_ordinals_map_to_nvml_indices():
    assert monitor.nvml_index(0, {}) == 0
    assert monitor.nvml_index(1, {"CUDA_VISIBLE_DEVICES": "3,5"}) == 5
    assert monitor.nvml_index(0, {"CUDA_VISIBLE_DEVICES": "GPU-abc"}) == "GPU-abc"


def test_uuid_handles(monkeypatch):
    FakeNvml([_gpu(uuid="GPU-x", used=7 * GiB)]).install(monkeypatch)
    assert monitor.device_used_bytes(["GPU-x"]) == [7 * GiB]


@pytest.mark.parametrize("interval", [0.005])
def test_monitor_stops_its_thread(monkeypatch, interval):
    import threading

    FakeNvml().install(monkeypatch)
    with monitor.Monitor([0], interval=interval):
        assert any(t.name == "jaxmem-nvml" for t in threading.enumerate())
    assert not any(t.name == "jaxmem-nvml" for t in threading.enumerate())


def test_verify_html_has_the_trace_and_the_throttle_warning(monkeypatch, tmp_path):
    """The HTML of a GPU verify: min/median/max, one line per GPU in each chart, the throttle warning."""
    from jaxmem.pipeline import AnalyzeOptions, analyze_file
    from jaxmem.present import verify_html
    from jaxmem.truth import measure, verify

    FakeNvml([_gpu(util=[20, 80, 90], used=[1 * GiB, 2 * GiB, 2 * GiB], reasons=[0, HW_SLOWDOWN, 0]),
              _gpu(util=[25, 85, 95], used=[1 * GiB, 2 * GiB, 2 * GiB])]).install(monkeypatch)
    mon = monitor.Monitor([0, 1], interval=3600)
    with mon:
        mon.sample()
    fixture = str(__import__("pathlib").Path(__file__).parent / "fixtures" / "mlp_small.py")
    rep = analyze_file(fixture, AnalyzeOptions(gpu="cpu", mesh="data=2", layout="dp", explain=False))
    m = {"method": "allocator peak", "backend": "gpu", "device": "NVIDIA H100 80GB HBM3", "n_devices": 2,
         "measured_peak_bytes": [rep.per_device_peak_bytes] * 2, "monitor": mon.summary(),
         "monitor_trace": mon.trace()}
    result = verify.combine(rep, measure.Case(model_file=fixture, backend="gpu", mesh="data=2"), m)
    assert result.to_json()["monitor"]["throttle_reasons"] == {"hw_slowdown": 1}
    assert result.to_json()["warnings"] == [monitor.throttle_warning(mon.summary())]
    path = tmp_path / "verify.html"
    verify_html.write(result, str(path))
    page = path.read_text()
    assert page.count("<svg") == 4 and page.count("<polyline") == 8     # 4 metrics x 2 GPUs
    assert "hw_slowdown (1 of 6 samples)" in page and "GPU utilization" in page   # 3 per GPU
    assert "<td>20.0 %</td><td>82.5 %</td><td>95.0 %</td>" in page             # min / median / max over both GPUs


def test_the_step_runs_on_its_own_outputs_while_watched():
    """The GPU measurement keeps training for MONITOR_SECONDS after the measured step (here on the CPU:
    the same built step, compiled and fed its own outputs: donated state in, new state out)."""
    import jax

    from jaxmem.truth import measure

    fixture = str(__import__("pathlib").Path(__file__).parent / "fixtures" / "mlp_small.py")
    case = measure.Case(model_file=fixture, model_args=(("width", 64), ("batch_size", 16)), backend="cpu",
                        mesh="data=1", layout="dp")
    built = measure.build_case(case, jax.devices("cpu"))
    compiled, _ = measure._compile(built)
    args, _ = measure.random_args(built)
    out = compiled(*args)
    # three more steps, each on the previous one's outputs (an error would stop them early)
    assert measure._more_steps_for_the_monitor(compiled, args, out, seconds=600, max_steps=3) == 3
    assert measure._more_steps_for_the_monitor(compiled, args, (out[0],)) == 0   # not jaxmem's step: once only

"""benchmarks/accuracy.py's own logic: how a row is scored, summarised and written, and its cases."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


acc = _load("accuracy_bench", ROOT / "benchmarks" / "accuracy.py")
MB = 10**6
CASE = acc.BenchCase("x-dp", "models/mlp.py", (("preset", "base"), ("batch_size", 8)), "data=8", "dp")


def runs(*peaks, args=100 * MB):
    return [{"peak": p, "args": args} for p in peaks]


def test_score_reports_the_spread_and_the_error_against_each_repeat():
    s = acc.score(300 * MB, runs(290 * MB, 300 * MB, 310 * MB))
    assert s["measured"] == {"median": 300 * MB, "min": 290 * MB, "max": 310 * MB, "n": 3}
    assert s["err"] == 0
    assert s["err_range"] == pytest.approx((300 / 310 - 1, 300 / 290 - 1))


def test_non_argument_error_is_on_what_xla_had_to_plan():
    # arguments 200 MB exact on both sides; 100 MB planned vs 110 MB measured: -1/11 there, -3.2% on the total
    s = acc.score(300 * MB, runs(310 * MB, args=200 * MB))
    assert s["non_arg_measured"]["median"] == 110 * MB and s["non_arg_predicted"] == 100 * MB
    assert s["non_arg_err"] == pytest.approx(-10 / 110)
    assert s["err"] == pytest.approx(-10 / 310)
    assert abs(s["non_arg_err"]) > abs(s["err"])  # the honest number is the larger one


def test_row_scores_baselines_against_the_program_jaxmem_predicts_and_defaults_separately():
    row = acc.make_row(CASE, 100 * MB, runs(100 * MB, 102 * MB, 98 * MB), runs(120 * MB, 121 * MB, 119 * MB),
                       classic=50 * MB, simulator=90 * MB)
    assert row["same"]["err"] == 0 and row["default"]["err"] == pytest.approx(100 / 120 - 1)
    assert row["classic_err"] == -0.5 and row["simulator_err"] == pytest.approx(-0.1)
    failed = acc.make_row(CASE, None, [], [], error="predict: boom")
    assert "same" not in failed and failed["error"] == "predict: boom"


def test_summary_names_the_cases_where_jaxmem_is_not_closer():
    good = acc.make_row(CASE, 100 * MB, runs(101 * MB, 101 * MB, 101 * MB), [], classic=50 * MB, simulator=90 * MB)
    other = acc.BenchCase("y-fsdp", "models/gpt2.py", (("preset", "gpt2"), ("batch_size", 8)), "data=8", "fsdp")
    lost = acc.make_row(other, 120 * MB, runs(100 * MB, 100 * MB, 100 * MB), runs(130 * MB),
                        classic=104 * MB, simulator=119 * MB)
    small = acc.make_row(CASE, 10 * MB, runs(20 * MB), [], classic=20 * MB, simulator=20 * MB)  # under 100 MB
    broken = acc.make_row(other, None, [], [], error="measure: x")
    s = acc.summary([good, lost, small, broken])
    assert s["cases"] == 4 and s["measured"] == 3 and s["at_least_100MB"] == 2
    assert s["max_abs_err"] == pytest.approx(0.2) and s["median_abs_err"] == pytest.approx((0.2 + 1 / 101) / 2)
    assert s["not_better_than_classic"] == ["y-fsdp"] and s["not_better_than_simulator"] == ["y-fsdp"]
    assert s["wins_vs_simulator"] == 1 and s["failed"] == ["y-fsdp"]
    assert s["default_max_abs_err"] == pytest.approx(1 - 120 / 130)   # only the lost row ran with XLA's defaults


def test_markdown_states_what_it_shows_and_every_setting_that_differs_from_default_jax():
    row = acc.make_row(CASE, 100 * MB, runs(101 * MB, 100 * MB, 99 * MB), runs(120 * MB, 118 * MB, 119 * MB),
                       classic=50 * MB, simulator=90 * MB, xla_temp=5, xla_argument=6)
    meta = {"backend": "cpu", "device": "d", "versions": "v", "date": "today", "total_s": 1.0, "repeats": 3,
            "command": "python benchmarks/accuracy.py", "gpu_name": "cpu", "overhead": "o", "how": "h"}
    text = acc.markdown([row], meta)
    for needed in ("not a GPU accuracy claim", "non-arg", "xla_cpu_experimental_ynn_fusion_type",
                   "MALLOC_MMAP_THRESHOLD_=65536", "Default XLA:CPU settings", "simulator", "classic",
                   "(99.0-101.0, n=3)", "jaxmem analyze models/mlp.py --gpu cpu --mesh data=8"):
        assert needed in text, needed
    assert "**not closer on" not in text   # jaxmem wins this row against both baselines


def test_raw_results_render_again_without_measuring(tmp_path):
    case = acc.CASES[0]
    preds = {case.id: {"predicted": 100 * MB, "classic": 50 * MB, "simulator": 90 * MB, "xla_temp": 1,
                       "xla_argument": 2}}
    measured = {(case.id, False): runs(99 * MB, 101 * MB, 100 * MB), (case.id, True): runs(110 * MB)}
    meta = {"backend": "cpu", "device": "d", "versions": "v", "date": "today", "total_s": 1.0, "repeats": 3,
            "command": "c", "gpu_name": "cpu", "overhead": "o", "how": "h"}
    acc.save_raw(tmp_path / "raw.json", meta, preds, measured, {}, {case.id: case.mesh})
    rows = acc.render_raw(tmp_path / "raw.json", tmp_path / "raw.md")
    assert rows[0]["same"]["err"] == 0 and rows[0]["default"]["measured"]["n"] == 1
    assert "(99.0-101.0, n=3)" in (tmp_path / "raw.md").read_text()


def test_cases_include_at_least_two_hand_written_steps_that_exist():
    hand = [c for c in acc.CASES if c.handwritten]
    assert len(hand) >= 2 and len({c.model for c in hand}) >= 2
    for c in hand:
        text = (ROOT / c.model).read_text()
        # written the way users write it: plain jax.jit, donated state, no jaxmem step builder
        assert "def train_step_by_hand(" in text and "def workload(" in text
        assert "donate_argnums" in text and "jax.jit(" in text and "jaxmem.program" not in text
    assert any(c.mesh != "data=1" for c in hand)   # shardings by hand over several devices
    assert len({c.id for c in acc.CASES}) == len(acc.CASES)


def test_a_hand_written_step_is_measured_by_jaxmems_own_routine():
    sys.path.insert(0, str(ROOT / "benchmarks" / "handwritten"))
    measure_hand = _load("measure_hand", ROOT / "benchmarks" / "handwritten" / "measure_hand.py")
    m = measure_hand.run(str(ROOT / "benchmarks" / "handwritten" / "cnn.py"),
                         (("batch_size", 4), ("image_size", 16), ("width", 8)), 1, xla_defaults=False)
    assert m["method"].startswith("peak RSS: /proc/self/clear_refs") and m["n_devices"] == 1
    # the hand-written step's arguments are what XLA counts, and its peak holds XLA's whole plan
    assert m["args_bytes"] == [m["xla"]["argument"]]
    assert m["measured_peak_bytes"][0] >= m["xla"]["lower_bound"]


def test_runs_of_processes_measured_at_the_same_time_add_up(tmp_path):
    case = acc.CASES[0]
    meta = {"backend": "cpu", "device": "d", "versions": "v", "date": "today", "total_s": 1.0, "repeats": 1,
            "command": "c", "gpu_name": "cpu", "overhead": "o", "how": "h; code: jaxmem at commit abc"}
    preds = {case.id: {"predicted": 100 * MB, "classic": 50 * MB, "simulator": 90 * MB}}
    acc.save_raw(tmp_path / "a.json", meta, preds, {(case.id, False): runs(99 * MB, 100 * MB)}, {},
                 {case.id: case.mesh})
    acc.save_raw(tmp_path / "b.json", meta, {}, {(case.id, False): runs(101 * MB), (case.id, True): runs(120 * MB)},
                 {}, {case.id: case.mesh})
    (row,) = acc.render_raw([tmp_path / "a.json", tmp_path / "b.json"], tmp_path / "m.md")
    assert row["same"]["measured"] == {"median": 100 * MB, "min": 99 * MB, "max": 101 * MB, "n": 3}
    assert row["default"]["measured"]["n"] == 1 and row["simulator"] == 90 * MB
    assert "merged from 2 benchmark processes" in (tmp_path / "m.md").read_text()

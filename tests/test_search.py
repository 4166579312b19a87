"""Fit searches: few compiles, and an answer proven by a compile that fits and one a step further that does not."""
import json
import random
import types

import pytest

from jaxmem.pipeline import AnalyzeOptions
from jaxmem.plan import compare, search, sweep


def _run(peak, budget, *, count=1 << 16, degree=1, first=(0, 15), feature=float, cand=lambda k: k + 1):
    s = search.Search(cand, count, feature, degree=degree, first=first)
    compiles = 0
    while props := s.propose():
        for k in props:
            compiles += 1
            p = peak(cand(k))
            s.record(k, p, p <= budget, budget)
    lo, hi = s.bounds()
    return s, lo, hi, compiles


@pytest.mark.parametrize("boundary", [3, 17, 500, 9000])
def test_an_affine_curve_is_found_in_four_compiles(boundary):
    # peak(b) = fixed + per_sample * b; the largest b within the budget is `boundary`
    s, lo, hi, compiles = _run(lambda b: 10_000 + 37 * b, 10_000 + 37 * boundary + 18)
    assert (s.candidates(lo), s.candidates(hi)) == (boundary, boundary + 1)
    assert compiles == 4                      # two to fit the line, two to prove the jump


def test_a_quadratic_curve_from_three_points():
    s, lo, hi, compiles = _run(lambda n: 10_000 + 40 * n + 0.02 * n * n, 200_000, degree=2, first=(0, 3, 15))
    assert s.candidates(hi) == s.candidates(lo) + 1
    assert 10_000 + 40 * s.candidates(lo) + 0.02 * s.candidates(lo) ** 2 <= 200_000
    assert compiles <= 7


def test_jitter_still_ends_in_a_proof():
    rng = random.Random(0)
    table = {}

    def peak(b):  # XLA's choices move the peak by more than one sample's worth
        return table.setdefault(b, 75_000_000 + 9_000 * b + rng.randint(-2_000_000, 2_000_000))

    s, lo, hi, compiles = _run(peak, 100_000_000)
    assert hi == lo + 1 and table[s.candidates(lo)] <= 100_000_000 < table[s.candidates(hi)]
    assert compiles <= 34                     # no worse than doubling and bisection (2 x 17)


def test_nothing_fits_and_the_search_limit():
    s, lo, hi, compiles = _run(lambda b: 10 ** 12, 10)
    assert (lo, hi) == (-1, 0) and compiles == 2
    s, lo, hi, compiles = _run(lambda b: 100 + b, 10 ** 12, count=4096)
    assert (lo, hi) == (4095, None) and compiles <= 7          # no slope: it grows 4x per compile


def test_fewest_devices_on_a_curve_in_one_over_devices():
    values = [64, 32, 16, 8, 4, 2, 1]          # candidates: the most devices first
    s, lo, hi, compiles = _run(lambda d: 1_000 + 64_000 / d, 1_000 + 64_000 / 5, count=len(values),
                               feature=lambda d: 1 / d, cand=lambda k: values[k], first=(0, 3))
    assert (values[lo], values[hi]) == (16, 8) or (values[lo], values[hi]) == (8, 4)
    assert 1_000 + 64_000 / values[lo] <= 1_000 + 64_000 / 5 < 1_000 + 64_000 / values[hi]
    assert compiles <= 4


class FakePool:
    """Answers each probe from a formula in its options, in process."""

    def __init__(self, peak_of):
        self.peak_of, self.queue = peak_of, []

    def submit(self, job):
        self.queue.append(job)

    def running(self):
        return self.queue[:1]

    def next(self, timeout=None):
        job = self.queue.pop(0)
        target = types.SimpleNamespace(usable_bytes=1_000_000)
        rep = types.SimpleNamespace(per_device_peak_bytes=int(self.peak_of(job.options)), target=target,
                                    timings={"cache_hit": 0.0})
        return sweep.Outcome(job, rep, None, "ok")

    def close(self):
        pass


def test_find_seq_searches_the_workload_argument(monkeypatch):
    def peak(opts):
        args = dict(opts.model_args)
        assert args["preset"] == "tiny" and args["seq_len"] % 64 == 0
        return 100_000 + 300 * args["seq_len"] + 0.05 * args["seq_len"] ** 2

    monkeypatch.setattr(sweep, "make_pool", lambda *a: FakePool(peak))
    base = AnalyzeOptions(gpu="h100", mesh="data=8", model_args=(("preset", "tiny"),))
    [cell] = compare.compare("m.py", base, {}, find=compare.Find("seq", arg="seq_len", granule=64, margin=0.1),
                             progress=False)
    s = cell.search
    assert (s.kind, s.arg, s.granule) == ("seq", "seq_len", 64)
    assert s.fails_at.value == s.fits_at.value + 64 == s.answer + 64
    assert s.fits_at.peak_bytes <= 900_000 < s.fails_at.peak_bytes      # 10% margin off 1,000,000
    assert s.compiles == len(s.probes) <= 7


def test_a_value_the_workload_refuses_bounds_the_answer(monkeypatch):
    class Refusing(FakePool):
        def next(self, timeout=None):
            job = self.queue[0]
            if dict(job.options.model_args)["seq_len"] > 100:
                self.queue.pop(0)
                return sweep.Outcome(job, None, "seq_len exceeds block_size=100", "user_error")
            return super().next()

    monkeypatch.setattr(sweep, "make_pool", lambda *a: Refusing(lambda opts: 1000 * dict(opts.model_args)["seq_len"]))
    [cell] = compare.compare("m.py", AnalyzeOptions(gpu="h100"), {}, find=compare.Find("seq", arg="seq_len", granule=10),
                             progress=False)
    s = cell.search
    assert (s.answer, s.fails_at.value) == (100, 110)
    assert s.fails_at.error == "seq_len exceeds block_size=100" and s.fails_at.peak_bytes is None


def test_find_devices_varies_the_first_data_axis(monkeypatch):
    def peak(opts):
        mesh = dict(kv.split("=") for kv in opts.mesh.split(","))
        assert mesh["model"] == "2" and opts.batch == 96
        return 200_000 + 6_000_000 / int(mesh["data"])

    monkeypatch.setattr(sweep, "make_pool", lambda *a: FakePool(peak))
    base = AnalyzeOptions(gpu="h100", mesh="data=2,model=2", layout="fsdp_tp", batch=96)
    [cell] = compare.compare("m.py", base, {}, find=compare.Find("devices", margin=0.0), progress=False)
    s = cell.search
    assert (s.answer, s.fails_at.value) == (8, 6)     # divisors of 96: ... 12, 8, 6 ...
    assert s.fits_at.peak_bytes <= 1_000_000 < s.fails_at.peak_bytes


def test_the_searches_refuse_what_they_cannot_answer():
    from jaxmem.errors import UserError

    base = AnalyzeOptions(gpu="h100", mesh="data=8")
    with pytest.raises(UserError, match="not --gpu cpu"):
        compare.compare("m.py", AnalyzeOptions(gpu="cpu", mesh="data=8"), {}, find=compare.Find("batch"))
    with pytest.raises(UserError, match="needs --batch"):
        compare.compare("m.py", base, {}, find=compare.Find("devices"))
    with pytest.raises(UserError, match="drop --arg seq_len"):
        compare.compare("m.py", AnalyzeOptions(gpu="h100", model_args=(("seq_len", 8),)), {},
                        find=compare.Find("seq", arg="seq_len"))


def test_find_batch_answer_fits_and_one_granule_more_does_not(tmp_path, monkeypatch):
    """Real compiles: a tiny MLP on 2 x h100 with a memory fraction that puts the boundary at a small batch."""
    from click.testing import CliRunner

    from jaxmem.cli import main

    monkeypatch.setenv("JAXMEM_CACHE", str(tmp_path))
    r = CliRunner().invoke(main, ["compare", "tests/fixtures/mlp_small.py", "--gpu", "h100", "--mesh", "data=2",
                                  "--mem-fraction", "0.00103", "--find-batch", "--jobs", "2", "--json"])
    assert r.exit_code == 0, r.output
    [row] = json.loads(r.stdout)
    s = row["search"]
    fits_at, fails_at = s["fits_at"], s["fails_at"]
    assert row["max_batch"] == s["answer"] == fits_at["value"] > 0 and s["granule"] == 2
    assert fails_at["value"] == fits_at["value"] + 2
    budget = int(fits_at["usable_bytes"] * (1 - s["margin"]))
    assert fits_at["peak_bytes"] <= budget < fails_at["peak_bytes"]
    assert s["margin"] == search.DEFAULT_MARGIN
    # the row is the full analysis at the answer, and every probe was a compile (an empty cache)
    assert row["report"]["options"]["batch"] == s["answer"] and row["per_device_peak_bytes"] == fits_at["peak_bytes"]
    assert s["compiles"] == len(s["probes"])

"""The allocator a run uses, in the verdict (issue 52): what is read (--allocator / --mem-fraction, else the
environment's XLA_PYTHON_CLIENT_* variables, else JAX's preallocated BFC at 0.75), what each mode's verdict
says, the fraction band, and every planner judging with the same allocator. No compiles: stand-in runtimes
and budgets (jaxmem.compiler.runtime), except the planners' test at the end (slow)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from jaxmem.compiler import allocator, runtime, targets
from jaxmem.errors import UserError
from jaxmem.plan import changes
from jaxmem.program.options import AnalyzeOptions

GiB = 1 << 30
CARD = targets.Target("h100", "cuda", "stand-in", 100 * GiB, True, ())


def _rt(oop_low, oop, oop_high, in_pool=(0, 0, 0)):
    """A stand-in runtime: one in-pool term and one out-of-pool term, each with its range."""
    return runtime.Runtime((
        runtime.Term("allocator", in_pool[1], True, "x", low_bytes=in_pool[0], high_bytes=in_pool[2]),
        runtime.Term("nccl_communicators", oop, False, "x", low_bytes=oop_low, high_bytes=oop_high)))


# ---------------------------------------------------------------- what is read


def test_defaults_are_jaxs_preallocated_bfc_at_three_quarters_with_the_note_reports_always_had():
    a = allocator.read({})
    assert (a.kind, a.preallocate, a.fraction, a.mode) == ("bfc", True, 0.75, "prealloc")
    assert a.note == "JAX default: 75% of the card, preallocated"   # goldens and README samples hold this note
    assert (a.kind_source, a.fraction_source) == ("default", "default")
    assert "fails at once" in a.why


def test_the_environment_variables_are_read():
    a = allocator.read({"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9",
                        "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    assert (a.kind, a.fraction, a.preallocate, a.mode) == ("cuda_async", 0.9, False, "async_grow")
    assert (a.kind_source, a.fraction_source) == ("user", "user")
    assert "XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async" in a.why and "release threshold" in a.why
    # the newer name wins, as in jaxlib; "default" is JAX's BFC
    b = allocator.read({"XLA_CLIENT_MEM_FRACTION": "0.8", "XLA_PYTHON_CLIENT_ALLOCATOR": "default"})
    assert (b.kind, b.fraction, b.kind_source) == ("bfc", 0.8, "default")
    assert b.note == "XLA_CLIENT_MEM_FRACTION=0.8, preallocated"
    assert allocator.read({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}).mode == "platform"


def test_the_flags_are_read_over_the_environment():
    a = allocator.read({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"},
                       "cuda_async", 0.85)
    assert (a.kind, a.fraction, a.mode) == ("cuda_async", 0.85, "async")
    assert a.why.startswith("--allocator cuda_async:") and "--mem-fraction 0.85" in a.note
    assert allocator.read({}, "platform").note.startswith("--allocator=platform:")


@pytest.mark.parametrize("env, flag, frac, culprit", [
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "jemalloc"}, None, None, "XLA_PYTHON_CLIENT_ALLOCATOR"),
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "vmm"}, None, None, "vmm"),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"}, None, None, "XLA_PYTHON_CLIENT_MEM_FRACTION=1.5"),
    ({"XLA_CLIENT_MEM_FRACTION": "most"}, None, None, "XLA_CLIENT_MEM_FRACTION"),
    ({}, "platform", 0.9, "--mem-fraction 0.9 with the platform allocator"),
    ({}, "tcmalloc", None, "--allocator tcmalloc"),
])
def test_settings_jaxmem_cannot_apply_are_refused_naming_the_culprit(env, flag, frac, culprit):
    with pytest.raises(UserError, match=culprit.replace("(", r"\(")):
        allocator.read(env, flag, frac)


@pytest.mark.parametrize("env, flag, frac", [
    ({}, None, None), ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, None, None),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}, None, None), ({}, None, 0.6), ({}, "platform", None),
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, None, None), ({}, "cuda_async", None),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "0"}, "cuda_async", 0.8),
])
def test_a_saved_note_reads_back_as_the_settings_that_wrote_it(env, flag, frac):
    a = allocator.read(env, flag, frac)
    assert (a.mode, a.fraction) in allocator.from_note(a.note)


# ---------------------------------------------------------------- each mode's verdict


def _budget(env=None, kind=None, frac=None, rt=None):
    return runtime.budget(CARD, frac, rt or _rt(GiB, GiB, GiB), allocator=kind, env=env or {})


def test_preallocated_bfc_fails_at_once_above_its_pool():
    rt = _rt(GiB, GiB, GiB)
    bud = _budget(rt=rt)
    assert bud.usable_bytes == 75 * GiB and bud.mode == "prealloc"
    assert runtime.judge(bud, 74 * GiB, rt).verdict == "fits"
    assert runtime.judge(bud, 76 * GiB, rt).verdict == "does_not_fit"   # the card has room; the pool has not


def test_on_demand_bfc_keeps_its_cap_and_says_fragmentation_can_fail_it():
    rt = _rt(GiB, GiB, GiB)
    bud = _budget({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, rt=rt)
    assert bud.mode == "grow" and "fragmentation" in bud.allocator.why
    assert runtime.judge(bud, 74 * GiB, rt).verdict == "fits"
    assert runtime.judge(bud, 76 * GiB, rt).verdict == "does_not_fit"


def test_platform_takes_the_whole_card_less_the_memory_outside_the_pool():
    rt = _rt(GiB, 2 * GiB, 3 * GiB)
    bud = _budget(kind="platform", rt=rt)
    assert runtime.judge(bud, 90 * GiB, rt).verdict == "fits"
    assert runtime.judge(bud, 98 * GiB, rt).verdict == "tight"       # fits at the low end of NCCL's range only
    assert runtime.judge(bud, 99.5 * GiB, rt).verdict == "does_not_fit"


def test_cuda_async_above_its_threshold_never_fits():
    rt = _rt(GiB, 2 * GiB, 4 * GiB)
    bud = _budget(kind="cuda_async", rt=rt)
    assert bud.mode == "async" and bud.usable_bytes == 75 * GiB   # the release threshold, not a cap
    assert runtime.judge(bud, 70 * GiB, rt).verdict == "fits"
    # 80 GiB > the 75 GiB threshold, and the card holds it beside the out-of-pool terms: it runs, but tight
    v = runtime.judge(bud, 80 * GiB, rt)
    assert v.verdict == "tight" and v.fits is True and v.terms[0]["name"] == runtime.ABOVE_THRESHOLD
    assert v.terms[0]["low_bytes"] == 75 * GiB and v.terms[0]["high_bytes"] == 80 * GiB
    (w,) = [w for w in runtime.verdict_warnings(CARD, rt, bud, v) if w.kind == "allocator_above_threshold"]
    assert "intermittently" in w.message and "between 0.8 and 0.96" in w.message and w.bytes == 5 * GiB
    # the same peak under BFC: does not fit at once
    assert runtime.judge(_budget(rt=rt), 80 * GiB, rt).verdict == "does_not_fit"
    # above the threshold and the card cannot hold the peak beside even the low end outside: does not fit
    assert runtime.judge(bud, 99.5 * GiB, rt).verdict == "does_not_fit"


def test_cuda_async_never_fits_at_any_peak_above_its_threshold():
    rt = _rt(GiB, 2 * GiB, 4 * GiB)
    for kind_env in ({}, {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}):
        bud = _budget(kind_env, kind="cuda_async", frac=0.5, rt=rt)
        for peak in range(51, 100):
            assert runtime.judge(bud, peak * GiB, rt).verdict != "fits", (kind_env, peak)


# ---------------------------------------------------------------- the fraction band


def test_the_band_is_the_peak_over_the_card_to_the_card_less_the_outside_memory_at_its_high_end():
    rt = _rt(GiB, 2 * GiB, 4 * GiB, in_pool=(0, GiB // 2, GiB))
    bud = _budget(rt=rt)
    floor, ceiling = runtime.band(bud, 22 * GiB, rt)
    assert (floor, ceiling) == (0.23, 0.96)          # (22 + 1 high in-pool) / 100, (100 - 4 high outside) / 100
    # rounded outward: any fraction in the band holds the peak and leaves room for the outside terms
    odd = runtime.band(bud, 22 * GiB + 1, rt)[0]
    assert odd == 0.2301 and int(100 * GiB * odd) >= 23 * GiB + 1
    # empty: no fraction fits, and every allocator's verdict is does_not_fit at the low end of the outside terms
    floor, ceiling = runtime.band(bud, 98 * GiB, _rt(3 * GiB, 3 * GiB, 3 * GiB))
    assert floor > ceiling
    for kind in ("bfc", "platform", "cuda_async"):
        b = _budget(kind=kind, rt=_rt(3 * GiB, 3 * GiB, 3 * GiB))
        assert runtime.judge(b, 98 * GiB, _rt(3 * GiB, 3 * GiB, 3 * GiB)).verdict == "does_not_fit"
    # no band without a fraction to set
    assert runtime.band(runtime.Budget(None, "cpu", None), GiB, rt) == (None, None)


def test_a_fraction_inside_the_band_fits_under_bfc_and_cuda_async():
    rt = _rt(GiB, 2 * GiB, 4 * GiB, in_pool=(0, GiB // 2, GiB))
    floor, ceiling = runtime.band(_budget(rt=rt), 60 * GiB, rt)
    for kind in ("bfc", "cuda_async"):
        for frac in (floor, (floor + ceiling) / 2, ceiling):
            assert runtime.judge(_budget(kind=kind, frac=frac, rt=rt), 60 * GiB, rt).verdict == "fits", (kind, frac)
        assert runtime.judge(_budget(kind=kind, frac=floor - 0.01, rt=rt), 60 * GiB, rt).verdict != "fits"
        assert runtime.judge(_budget(kind=kind, frac=ceiling + 0.01, rt=rt), 60 * GiB, rt).verdict != "fits"


# ---------------------------------------------------------------- the planners


@dataclasses.dataclass
class _Saved:
    fraction_floor: float | None
    fraction_ceiling: float | None


def test_advise_proposes_fractions_inside_the_band(monkeypatch):
    for name in ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(name, raising=False)
    base = AnalyzeOptions(gpu="h100")
    assert changes._fractions(base) == [0.9, 0.95]                       # no band known: what trainers set
    assert changes._fractions(base, _Saved(0.781, 0.845)) == [0.79]      # the floor; 0.9 leaves NCCL no room
    assert changes._fractions(base, _Saved(0.80, 0.97)) == [0.8, 0.9, 0.95]
    assert changes._fractions(base, _Saved(0.5, 0.7)) == [0.7]            # 0.75 crowds the outside memory out
    # no fraction fits the step as given: only those that leave the outside memory room, for other changes to join
    assert changes._fractions(base, _Saved(0.98, 0.97)) == [0.9, 0.95]
    assert changes._fractions(base, _Saved(0.98, 0.85)) == []
    assert changes._fractions(dataclasses.replace(base, allocator="platform"), _Saved(0.5, 0.9)) == []


def test_a_saved_cuda_async_row_is_judged_again_as_cuda_async():
    from jaxmem.plan import saved_rows

    t = dataclasses.replace(_target_info(), usable_note=allocator.read({}, "cuda_async").note)
    (b,) = saved_rows._saved_budgets(t, 2 * GiB)
    assert b.mode == "async" and b.fraction == 0.75


def _target_info():
    from jaxmem.report import TargetInfo

    spec = targets.CATALOGUE["h100"]
    return TargetInfo("h100", spec.description, "cuda", 8, 1, True, spec.memory_bytes, None, "")


@pytest.mark.slow
def test_changing_the_allocator_moves_analyze_compare_and_a_saved_rows_verdict(tmp_path):
    """One tiny step at a memory fraction below its peak: preallocated BFC fails it at once, cuda_async runs it
    above its release threshold (tight, never fits); analyze, compare's rows and the rows compare --from re-judges
    all follow the allocator given."""
    import json

    import jaxmem
    from jaxmem.plan import saved_rows

    kw = dict(args={"preset": "tiny"}, gpu="h100", mesh="data=2", mem_fraction=0.00001)
    verdicts = {}
    for kind in ("bfc", "cuda_async"):
        r = jaxmem.analyze("models/mlp.py", allocator=kind, explain=False, **kw)
        assert r.choices["allocator"] == kind and r.choices["sources"]["allocator"] == "user"
        rows = jaxmem.compare("models/mlp.py", allocator=kind, layouts=["dp", "fsdp"], jobs=1, **kw)
        path = tmp_path / f"{kind}.json"
        path.write_text(json.dumps(rows.to_json()))
        saved = saved_rows.load(str(path))
        verdicts[kind] = (r.verdict, [c.report.verdict for c in rows], [c.report.verdict for c in saved])
    assert verdicts["bfc"] == ("does_not_fit", ["does_not_fit"] * 2, ["does_not_fit"] * 2)
    assert verdicts["cuda_async"] == ("tight", ["tight"] * 2, ["tight"] * 2)


def test_changing_the_allocator_moves_advise_the_fit_search_and_the_explorers_points(monkeypatch):
    """The other planners judge with the allocator given too (issue 52 point 5). The environment's fraction is a
    thousandth of a percent of the card, below the tiny step's peak: preallocated BFC reads it as its pool (does
    not fit), cuda_async as its release threshold (runs above it: tight), the platform allocator does not read it
    (the whole card: fits). advise searches only where the step does not fit as given; the fit search's largest
    batch is none under BFC's pool and a real one on the whole card; the explorer's point follows the allocator
    of its start."""
    import jaxmem
    from jaxmem.explore.points import Explorer

    for name in ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.00001")
    kw = {"args": {"preset": "tiny"}, "gpu": "h100", "mesh": "data=2"}

    advice = {kind: jaxmem.advise("models/mlp.py", allocator=kind, changes=["fraction"], jobs=1, **kw)
              for kind in ("bfc", "cuda_async")}
    assert advice["bfc"].original.report.verdict == "does_not_fit" and advice["bfc"].searched
    assert advice["bfc"].fitting and all(c.report.target.usable_note.startswith("--mem-fraction")
                                         for c in advice["bfc"].fitting)   # a larger pool: the fraction changed
    assert advice["cuda_async"].original.report.verdict == "tight" and not advice["cuda_async"].searched

    found = {kind: jaxmem.compare("models/mlp.py", allocator=kind, find_batch=True, jobs=1, **kw)[0]
             for kind in ("bfc", "platform")}
    bfc, whole = found["bfc"].search, found["platform"].search
    assert bfc.fits_at is None and bfc.answer == 0                  # not even the first batch fits the pool
    assert whole.fits_at is not None and whole.answer > 0

    verdicts = {}
    for kind in ("bfc", "cuda_async", "platform"):
        ex = Explorer(os.path.abspath("models/mlp.py"), AnalyzeOptions(
            allocator=kind, model_args=(("preset", "tiny"),), gpu="h100", mesh="data=2"), jobs=1)
        try:
            p = ex.wait(ex.ask(ex.start))
            assert p.report is not None, (p.status, p.error)
            verdicts[kind] = (p.report.verdict, p.report.choices["allocator"])
        finally:
            ex.close()
    assert verdicts == {"bfc": ("does_not_fit", "bfc"), "cuda_async": ("tight", "cuda_async"),
                        "platform": ("fits", "platform")}

"""The grid and the largest-batch search of `jaxmem compare`."""
import dataclasses

import pytest

from jaxmem.plan import compare
from jaxmem.analyze import AnalyzeOptions
from jaxmem.errors import UserError


def test_grid_is_the_cartesian_product():
    g = compare.grid({"layout": "dp,fsdp", "batch": "8,16", "mesh": "data=8;data=4,model=2", "remat": None})
    assert len(g) == 8
    assert {"layout": "fsdp", "batch": 16, "mesh": "data=4,model=2"} in g
    with pytest.raises(UserError, match="--batch"):
        compare.grid({"batch": "8,many"})


@dataclasses.dataclass
class FakeReport:
    fits: bool | None


@pytest.mark.parametrize("capacity,accum,expected", [(100, 1, (96, False)), (7, 1, (0, False)), (10**9, 1, (1 << 16, True)),
                                                     (100, 2, (96, False))])
def test_largest_batch_search(monkeypatch, capacity, accum, expected):
    probes = []

    def fake(wl, opts, source):
        probes.append(opts.batch)
        assert opts.batch % (8 * accum) == 0 and not opts.explain
        return FakeReport(opts.batch <= capacity)

    monkeypatch.setattr(compare, "analyze_workload", fake)
    best, capped, report = compare.largest_batch(None, AnalyzeOptions(mesh="data=8", accum=accum), "m.py")
    assert (best, capped) == expected
    assert report.fits is (best > 0)
    assert len(probes) <= 2 * 17  # doubling, then bisection


def test_largest_batch_needs_a_fixed_memory(monkeypatch):
    monkeypatch.setattr(compare, "analyze_workload", lambda *a, **k: FakeReport(None))
    with pytest.raises(UserError, match="not --gpu cpu"):
        compare.largest_batch(None, AnalyzeOptions(mesh="data=8"), "m.py")

"""What analyzed before mesh axes had roles analyzes to the same report: every case of
tests/fixtures/golden/make_goldens.py (each shipped model's tiny preset under --mesh data=8
--layout fsdp, the other layouts on a data+model mesh, a custom step) gives JSON equal, key for
key, to the golden written from the commit before roles (keys added since are left out)."""

import importlib.util
import json
import pathlib

import pytest

from jaxmem.compiler import versions

GOLDEN = pathlib.Path(__file__).resolve().parent / "fixtures" / "golden"
_spec = importlib.util.spec_from_file_location("make_goldens", GOLDEN / "make_goldens.py")
make_goldens = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_goldens)


HELD = sorted(p.name[len("jax-"):] for p in GOLDEN.glob("jax-*"))


def _golden(version: str, name: str) -> dict:
    d = json.loads((make_goldens.version_dir(version) / f"{name}.json").read_text())
    for key in make_goldens.ENVIRONMENT + make_goldens.CHANGED:
        d.pop(key, None)
    return make_goldens.without_changed_in_buffers(d)


@pytest.mark.holds_for(*HELD)   # XLA's temporaries are version-specific: goldens are kept per version
@pytest.mark.parametrize("case", make_goldens.CASES, ids=[c[0] for c in make_goldens.CASES])
def test_report_equals_the_golden_from_before_roles(case):
    import jax

    fresh = json.loads(json.dumps(make_goldens.report_json(case), sort_keys=True))
    assert fresh == _golden(jax.__version__, case[0])


def test_every_minor_ci_runs_has_goldens():
    # .ci/run's legs (both ends of the range, the reference and the middle smoke between): each compares against
    # a golden, not skip; together they cover every minor of the declared range
    ci = pathlib.Path(__file__).resolve().parent.parent / ".ci"
    pins = [line.split("==")[1].strip() for f in ("lowest.txt", "reference.txt", "middle.txt", "newest.txt")
            for line in (ci / f).read_text().splitlines() if line.startswith("jax==")]
    assert len(pins) == 4 and set(pins) <= set(HELD)
    minors = {versions.parse(p)[:2] for p in pins}
    low, high = versions.TESTED
    assert minors == {(0, m) for m in range(low[1], high[1] + 1)}
    pins = [pins[0], pins[1], pins[3]]
    assert versions.parse(pins[0])[:3] == versions.TESTED[0] and versions.parse(pins[2])[:2] == versions.TESTED[1]


@pytest.mark.parametrize("case", make_goldens.CASES, ids=[c[0] for c in make_goldens.CASES])
def test_state_and_batch_bytes_are_identical_on_every_jax_held(case):
    """Parameters, optimizer state, the batch and the other state are jaxmem's count of the train
    state, not XLA's scheduling: the same bytes on every version (XLA's temporaries may differ)."""
    parts = ("params", "optimizer_state", "batch", "other_state")
    seen = {v: ({k: _golden(v, case[0])["breakdown"][k] for k in parts}, _golden(v, case[0])["param_count"])
            for v in HELD}
    assert len(seen) >= 2 and len(set(map(repr, seen.values()))) == 1, seen

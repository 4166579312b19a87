"""What analyzed before mesh axes had roles analyzes to the same report: every case of
tests/fixtures/golden/make_goldens.py (each shipped model's tiny preset under --mesh data=8
--layout fsdp, the other layouts on a data+model mesh, a custom step) gives JSON equal, key for
key, to the golden written from the commit before roles (keys added since are left out)."""

import importlib.util
import json
import pathlib

import pytest

GOLDEN = pathlib.Path(__file__).resolve().parent / "fixtures" / "golden"
_spec = importlib.util.spec_from_file_location("make_goldens", GOLDEN / "make_goldens.py")
make_goldens = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_goldens)


@pytest.mark.parametrize("case", make_goldens.CASES, ids=[c[0] for c in make_goldens.CASES])
def test_report_equals_the_golden_from_before_roles(case):
    golden = json.loads((GOLDEN / f"{case[0]}.json").read_text())
    fresh = json.loads(json.dumps(make_goldens.report_json(case), sort_keys=True))
    assert fresh == golden

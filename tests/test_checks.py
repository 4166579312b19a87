"""The report's warnings as a registry (jaxmem/analysis/checks.py): one table of checks, one list of
kinds (jaxmem.report.WARNING_KINDS) that the docs name, and no warning of a kind not listed."""
import pathlib
import re

import pytest

from jaxmem import report
from jaxmem.analysis import checks

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "analyze.md"


def _documented_kinds() -> set[str]:
    """The snake_case names in backticks in the first paragraph of docs/analyze.md's "## Warnings"."""
    text = DOCS.read_text()
    section = text.split("\n## Warnings\n", 1)[1].split("\n## ", 1)[0]
    paragraph = next(p for p in section.split("\n\n") if "`" in p)
    return set(re.findall(r"`([a-z0-9]+(?:_[a-z0-9]+)+)`", paragraph))


def test_the_docs_name_every_warning_kind_and_no_other():
    documented = _documented_kinds()
    assert set(report.WARNING_KINDS) == documented, (set(report.WARNING_KINDS) ^ documented)


def test_every_kind_has_a_check_and_the_table_keeps_the_kinds_order():
    produced = [k for c in checks.CHECKS for k in c.kinds]
    assert produced == list(report.WARNING_KINDS)   # the order a report lists them in, and WARNING_KINDS'


def test_every_kind_has_a_meaning():
    assert all(isinstance(v, str) and len(v) > 10 for v in report.WARNING_KINDS.values())


def test_a_warning_of_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown warning kind 'not_a_kind'"):
        report.ReportWarning("not_a_kind", "message")
    assert report.ReportWarning("not_donated", "m").kind == "not_donated"

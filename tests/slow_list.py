"""The tests the `slow` marker covers, from measured durations (conftest.py marks them).

    python -m pytest --durations=0 -p no:randomly > durations.txt
    python tests/slow_list.py durations.txt        # adds to tests/slow_tests.txt

A test is slow when its setup or call took at least THRESHOLD_S seconds on the 2-core machine the
suite is sized for: in practice every test that compiles a real step or runs jaxmem in a child
process. `pytest -m "not slow"` is the fast loop; the full suite is what CI runs.
"""

from __future__ import annotations

import pathlib
import re
import sys

THRESHOLD_S = 1.5
LIST = pathlib.Path(__file__).with_name("slow_tests.txt")


def slow_ids(durations_text: str) -> list[str]:
    """Test ids (parameters dropped: a parametrized test is slow as a whole) from pytest's
    `--durations` lines: '12.34s call     tests/test_x.py::test_y[param]'."""
    out = set()
    for m in re.finditer(r"^([\d.]+)s (?:setup|call)\s+(\S+)", durations_text, re.M):
        if float(m.group(1)) >= THRESHOLD_S:
            out.add(m.group(2).split("[")[0])
    return sorted(out)


def still_defined(test_id: str) -> bool:
    path, _, name = test_id.partition("::")
    file = LIST.parent.parent / path
    return file.exists() and re.search(rf"^def {re.escape(name)}\(", file.read_text(), re.M) is not None


if __name__ == "__main__":
    # Merged with the list already kept: one run's order decides which tests meet a warm compile
    # cache (fast there, slow alone), so a test leaves the list only when it no longer exists.
    kept = LIST.read_text().split() if LIST.exists() else []
    ids = sorted(i for i in set(slow_ids(pathlib.Path(sys.argv[1]).read_text())) | set(kept) if still_defined(i))
    LIST.write_text("".join(f"{i}\n" for i in ids))
    print(f"{len(ids)} slow tests -> {LIST}")

"""A point an earlier explorer compiled, asked of a new explorer of the same model (issue 45's "in the compile
cache answers in under 200 ms"): README command 1's step compiled by one explorer, then asked of a second one
(a fresh process state, the same cache folder), timed from the ask to the answer object.

    python benchmarks/explore_remembered.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ["JAXMEM_CACHE"] = tempfile.mkdtemp(prefix="jaxmem-remembered-")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from jaxmem.explore.points import Explorer  # noqa: E402
from jaxmem.program.options import AnalyzeOptions  # noqa: E402

START = AnalyzeOptions(gpu="h100", mesh="data=8", remat="full", precision="bf16")
MODEL = "models/llama.py"

if __name__ == "__main__":
    ex = Explorer(MODEL, START, jobs=1)
    first = ex.wait(ex.ask(START))
    ex.close()
    print(f"first explorer: {first.status} in {first.seconds:.1f} s (a worker's analyze)")
    ex = Explorer(MODEL, START, jobs=1)
    t0 = time.perf_counter()
    answer = ex.answer(ex.ask(START))
    dt = time.perf_counter() - t0
    ex.close()
    same = answer["report"] == first.report.to_json()
    print(f"a later explorer: {answer['answer']}, remembered={answer['remembered']}, in {dt * 1000:.1f} ms; "
          f"the same report: {same}")

"""examples/notebook.ipynb: valid nbformat 4, and its code cells run, in order, as a fresh kernel would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

NOTEBOOK = ROOT / "examples" / "notebook.ipynb"


def _cells():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4 and nb["nbformat_minor"] >= 5 and nb["metadata"]["kernelspec"]["language"] == "python"
    ids = [c["id"] for c in nb["cells"]]
    assert len(set(ids)) == len(ids)  # nbformat 4.5: every cell has its own id
    for c in nb["cells"]:
        assert c["cell_type"] in ("markdown", "code") and isinstance(c["source"], list)
        if c["cell_type"] == "code":
            assert c["outputs"] == [] and c["execution_count"] is None  # stored clean
    return nb["cells"]


def test_the_notebook_runs_from_a_fresh_kernel():
    cells = _cells()
    assert {"markdown", "code"} <= {c["cell_type"] for c in cells}
    script = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    # a fresh kernel: neither the deviceless switch nor forced CPU devices set (jaxmem sets them itself)
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "XLA_FLAGS")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", script], cwd=NOTEBOOK.parent, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(ln.startswith("tiny-mlp on 2 x h100: ") and ln.endswith("fits: True") for ln in lines), out.stdout
    assert any(ln.strip().startswith("optimizer_state") for ln in lines)
    assert any(ln.startswith("layout dp: ") for ln in lines) and any(ln.startswith("layout fsdp: ") for ln in lines)
    assert "UserError: unknown option 'layuot' (did you mean 'layout'?)" in out.stdout

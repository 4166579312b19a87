"""Every buffer of a scan attributed to the module that made it (jaxmem.xla.provenance): the stacked
residuals a scan's loop writes layer by layer, their transposed copies and the zero-filled stacks XLA
broadcasts for them, down to the layer's submodules, on the three kinds of scan users write."""

from __future__ import annotations

import pathlib

import jaxmem

HERE = pathlib.Path(__file__).parent
SHARE = 0.05   # issue 48: at most 5% of the peak's non-state bytes outside any module


def _outside(r) -> tuple[float, dict[str, int]]:
    rows = {m.module_path: m.bytes for m in r.modules if not m.module_path.startswith("[")}   # not state
    outside = sum(v for k, v in rows.items() if k.startswith("(no module"))
    return outside / sum(rows.values()), rows


def _tt_buffers(r, t: int):
    """The buffers live at the peak shaped (..., T, T): attention probabilities, stacked or transposed."""
    return [b for b in r.top_buffers if b.shape.replace(" ", "").endswith(f"{t},{t})")]


def test_an_nnx_scan_over_vmapped_blocks_names_the_blocks_submodules():
    r = jaxmem.analyze(str(HERE / "fixtures" / "nnx_scan_vmap.py"), gpu="h100", module_depth=4, top=40)
    share, rows = _outside(r)
    assert share <= SHARE, rows
    # the stacked residuals go to the submodule that made each slice, not the loop's scope alone
    for sub in ("Net/blocks/attn", "Net/blocks/up", "Net/blocks/down", "Net/blocks/norm"):
        assert rows.get(sub, 0) > 0, rows
    probs = _tt_buffers(r, 16)   # the stacked attention probabilities (was: the loop's scope, Net/blocks)
    assert probs and all(b.module_path == "Net/blocks/attn" for b in probs), probs


def test_the_config_decoders_scan_at_remat_none_names_every_stack_and_its_transposed_copies():
    r = jaxmem.analyze(str(HERE / "fixtures" / "hf" / "llama"), gpu="h100", remat="none", module_depth=4, top=60,
                       args={"batch_size": 2, "seq_len": 32})
    share, rows = _outside(r)
    assert share <= SHARE, rows
    assert rows.get("Decoder/layers/attn", 0) > 0 and rows.get("Decoder/layers/mlp", 0) > 0, rows
    # the stacked attention probabilities and the copies XLA transposes them into: the attention's
    probs = _tt_buffers(r, 32)
    assert probs and all(b.module_path == "Decoder/layers/attn" for b in probs), probs


def test_a_maxtext_style_linen_scan_names_its_stacked_residuals():
    r = jaxmem.analyze("models/llama.py", gpu="h100", remat="none", module_depth=4, top=60, args={"preset": "tiny"})
    share, rows = _outside(r)
    assert share <= SHARE, rows
    assert rows.get("Llama/layers/attn", 0) > 0 and rows.get("Llama/layers/mlp", 0) > 0, rows
    probs = _tt_buffers(r, 32)
    assert probs and all(b.module_path.startswith("Llama/layers/attn") for b in probs), probs

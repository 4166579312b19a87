"""Every buffer of a scan attributed to the module that made it (jaxmem.xla.provenance): the stacked
residuals a scan's loop writes layer by layer, their transposed copies and the zero-filled stacks XLA
broadcasts for them, down to the layer's submodules, on the three kinds of scan users write."""

from __future__ import annotations

import pathlib

import jaxlib

import jaxmem
from jaxmem.compiler import versions

HERE = pathlib.Path(__file__).parent
SHARE = 0.05   # issue 48: at most 5% of the peak's non-state bytes outside any module
# jaxlib 0.12's XLA leaves some (T, T) buffers to the scan's own scope: the second zero-filled stack of a
# two-output broadcast fusion and a slice the loop body reads of a stack (its operand is the body's parameter).
# Known gap: they are attributed to the loop's module (Net/blocks, Decoder), not the attention under it.
SCOPE_ONLY = versions.parse(jaxlib.__version__)[:2] >= (0, 12)


def _made_by(probs, module: str, scope: str) -> bool:
    """Every (T, T) buffer is the attention's, or (SCOPE_ONLY) at least under the scan that runs it."""
    return all(b.module_path == module or (SCOPE_ONLY and b.module_path == scope) for b in probs) and \
        any(b.module_path == module for b in probs)


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
    assert probs and _made_by(probs, "Net/blocks/attn", "Net/blocks"), probs


def test_the_config_decoders_scan_at_remat_none_names_every_stack_and_its_transposed_copies():
    r = jaxmem.analyze(str(HERE / "fixtures" / "hf" / "llama"), gpu="h100", remat="none", module_depth=4, top=60,
                       args={"batch_size": 2, "seq_len": 32})
    share, rows = _outside(r)
    assert share <= SHARE, rows
    assert rows.get("Decoder/layers/attn", 0) > 0 and rows.get("Decoder/layers/mlp", 0) > 0, rows
    # the stacked attention probabilities and the copies XLA transposes them into: the attention's
    probs = _tt_buffers(r, 32)
    assert probs and _made_by(probs, "Decoder/layers/attn", "Decoder"), probs


def test_a_maxtext_style_linen_scan_names_its_stacked_residuals():
    r = jaxmem.analyze("models/llama.py", gpu="h100", remat="none", module_depth=4, top=60, args={"preset": "tiny"})
    share, rows = _outside(r)
    assert share <= SHARE, rows
    assert rows.get("Llama/layers/attn", 0) > 0 and rows.get("Llama/layers/mlp", 0) > 0, rows
    probs = _tt_buffers(r, 32)
    assert probs and all(b.module_path.startswith("Llama/layers/attn") for b in probs), probs


def test_a_zero_filled_stack_takes_the_module_of_the_slices_its_loop_writes_into_it():
    """The graph alone (no compile): broadcast -> tuple -> while, whose body's root writes the attention's
    slice into that element with a dynamic-update-slice named for the loop's scope only."""
    from jaxmem.xla.provenance import Graph, Node

    def node(opcode, path="", operands=(), called=(), comp=0, number=0, index=0):
        return Node(opcode, path, tuple(operands), tuple(called), comp, number, index)

    nodes = {
        1: node("fusion", called=(10,)),                       # the zero fill: an operand-less broadcast fusion
        2: node("tuple", operands=(1,)),
        3: node("while", path="M", operands=(2,), called=(20, 30)),
        4: node("get-tuple-element", operands=(3,)),
        5: node("transpose", operands=(4,)),                   # a copy XLA transposes the stack into
        11: node("broadcast", comp=10),
        21: node("parameter", comp=20),
        22: node("get-tuple-element", operands=(21,), comp=20),
        23: node("dot", path="M/layers/attn", operands=(22,), comp=20),
        24: node("dynamic-update-slice", path="M", operands=(22, 23), comp=20),
        25: node("tuple", operands=(24,), comp=20),
        31: node("compare", comp=30),
    }
    users: dict[int, list[int]] = {}
    for iid, n in nodes.items():
        for o in n.operands:
            users.setdefault(o, []).append(iid)
    g = Graph(nodes, {10: 11, 20: 25, 30: 31}, {10: [1], 20: [3], 30: [3]}, users)
    assert g.path(1) == "M/layers/attn"   # the stack, from its loop's writes
    assert g.path(3, (0,)) == "M/layers/attn"   # the loop's element: more specific than the loop's own "M"
    assert g.path(5) == "M/layers/attn"   # the transposed copy, from its operand
    assert g.path(24) == "M/layers/attn"  # the update names the write, not the loop scaffolding

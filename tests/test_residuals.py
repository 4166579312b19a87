"""A scan's saved residuals as the kernels move them (jaxmem.compiler.residuals) and the warning that
names them where their traffic outweighs what --remat full would recompute."""

from __future__ import annotations

import jaxmem
from jaxmem.compiler import steptime

DECODER = "benchmarks/outside/nnx_scan_decoder.py"
# the newcomer's NNX decoder of issue 48, small: the attention probabilities (heads x T x T) dominate
SMALL = {"batch_size": 1, "seq_len": 2048, "d_model": 64, "layers": 2, "heads": 4, "vocab": 256}


def test_a_scan_whose_saved_probabilities_outweigh_recompute_is_warned_with_its_stacks():
    r = jaxmem.analyze(DECODER, gpu="h100", args=SMALL)
    res = r.step_time["scan_residuals"]
    probs = 2 * 4 * 2048 * 2048 * 4   # one f32 (layers, 1, 1, heads, T, T) stack of softmax probabilities
    # each layer's slice written once into its stack (not the whole stack per layer), the stack zero-filled once
    assert res["written"] >= probs and res["filled"] >= probs, res
    assert res["stacks"][0]["shape"] == "f32[2,1,1,4,2048,2048]" and res["stacks"][0]["module"] == "Decoder/blocks/attn"
    assert res["seconds"] > res["recompute_s"]
    warned = [w for w in r.warnings if w.kind == "scan_residuals_traffic"]
    assert len(warned) == 1 and "f32[2,1,1,4,2048,2048] (Decoder/blocks/attn)" in warned[0].message, r.warnings


def test_no_warning_with_remat_or_where_recompute_costs_more():
    st = {"available": True, "scan_residuals": {"bytes": 1e9, "written": 5e8, "filled": 2e8, "read": 3e8,
                                                "copied": 0.0, "seconds": 3e-4, "recompute_s": 1e-3, "stacks": []}}
    assert steptime.check_scan_residuals("none", st) == []
    st["scan_residuals"]["recompute_s"] = 1e-4
    assert [w.kind for w in steptime.check_scan_residuals("none", st)] == ["scan_residuals_traffic"]
    assert steptime.check_scan_residuals("full", st) == []
    assert steptime.check_scan_residuals("none", {"available": True, "scan_residuals": None}) == []

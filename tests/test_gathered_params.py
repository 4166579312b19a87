"""gathered_params_live counts only all-gathered parameters (issue 51 point 2): a collective whose data is
a parameter's own, found through the program's graph (jaxmem.xla.provenance.Graph.argument), never a
gathered activation or batch; it fires on several layers' weights live at once, and its advice fits the
model: a Python loop is told to scan its layers in its own framework's terms (never nn.scan to NNX), a
model already scanned is told so."""

from __future__ import annotations

import pathlib

import jaxmem
from jaxmem.xla.gathered import GatheredParam, check_gathered_params, layer_of
from jaxmem.xla.provenance import Graph, Node

LAYERS = str(pathlib.Path(__file__).parent / "fixtures" / "gathered_layers.py")
MIB = 2**20


def _analyze(kind: str, **kw):
    args = {"kind": kind, **kw.pop("args", {})}
    return jaxmem.analyze(LAYERS, gpu="h100", mesh="data=8", model_args=tuple(args.items()), **kw)


def _gathered(r):
    return [w for w in r.warnings if w.kind == "gathered_params_live"]


def _says(message: str, word: str) -> bool:
    """`word` as written (nn.scan is not found inside nnx.scan)."""
    return any(piece.startswith(word) for piece in message.replace("(", " ").split())


def test_a_python_loop_of_linen_layers_is_told_to_scan_them_with_nn_scan():
    # 4 layers of 2 MiB gathered f32 weights, all live at the peak: 3 layers' more than FSDP needs
    [w] = _gathered(_analyze("linen_loop", args={"batch_size": 64}))
    assert w.bytes >= 2 * 2 * MIB and "layer_0" in w.message and "layer_1" in w.message
    assert _says(w.message, "nn.scan") and _says(w.message, "nn.remat") and "nnx" not in w.message
    assert "already" not in w.message


def test_an_nnx_loop_is_told_nnx_scan_and_nnx_remat_never_nn_scan():
    [w] = _gathered(_analyze("nnx_loop", args={"batch_size": 64}))
    assert w.bytes >= 2 * 2 * MIB and "blocks/0" in w.message
    assert _says(w.message, "nnx.scan") and _says(w.message, "nnx.remat") and _says(w.message, "nnx.vmap")
    assert not _says(w.message, "nn.scan") and not _says(w.message, "nn.remat")


def test_the_scan_a_loop_is_told_to_use_gathers_one_layer_at_a_time_and_lowers_the_peak():
    # the same checkpoint on each layer: the scan gathers one layer's weights per iteration and peaks lower than
    # the loop (which, on jax 0.10.2-0.12, still keeps every layer's gathered weights: 0.9.0's XLA frees them)
    loop = _analyze("linen_loop", args={"batch_size": 64}, remat="full", remat_at="^Layer$")
    scan = _analyze("linen_scan", args={"batch_size": 64}, remat="full", remat_at="^Layer$")
    assert not _gathered(scan)
    assert scan.xla["peak_memory"] < loop.xla["peak_memory"]


def test_a_linen_scan_with_a_wide_head_is_told_its_layers_are_scanned_already():
    # the 8 MiB head, gathered outside the scan, is live across it beside the scanned layer's weights
    [w] = _gathered(_analyze("linen_scan", args={"vocab": 8192}))
    assert "head" in w.message and w.bytes >= 8 * MIB
    assert "already run under nn.scan" in w.message and "run the layers under" not in w.message
    assert not _says(w.message, "nn.remat")


def test_an_nnx_scan_is_told_nnx_scan_is_there_already():
    [w] = _gathered(_analyze("nnx_scan", args={"vocab": 8192}))
    assert "already run under nnx.scan" in w.message and not _says(w.message, "nn.scan")


def test_a_gathered_batch_never_fires_it():
    # XLA gathers the custom step's (64, 512) batch, over a tenth of the peak; no parameter is gathered
    r = jaxmem.analyze(str(pathlib.Path(__file__).parent / "fixtures" / "custom_step.py"), gpu="h100",
                       mesh="data=8")
    assert r.peak_categories["collectives"] > 0.10 * r.xla["peak_memory"]
    assert not _gathered(r)


def test_layer_of_reads_the_layer_from_the_parameters_path():
    assert layer_of("params:blocks/2/mlp/up/kernel") == "blocks/2"
    assert layer_of("params:layer_0/dense/kernel") == "layer_0"
    assert layer_of("params:layers/up/kernel") == "layers"   # a scan's stack: one layer
    assert layer_of("params:embed/embedding") == "embed"


def _g(leaf: str, size: int, scanned: bool = False) -> GatheredParam:
    return GatheredParam(size, (size,), f"params:{leaf}", scanned)


def test_one_layers_gathered_weights_are_fsdp_working_and_several_are_warned_by_the_excess():
    one = [_g("layers/0/up/kernel", 60), _g("layers/0/down/kernel", 30)]
    assert not check_gathered_params(one, 100, model="linen", scanned=False)
    [w] = check_gathered_params([*one, _g("layers/1/up/kernel", 20)], 100, model="linen", scanned=False)
    assert w.bytes == 20 and "2 layers" in w.message and _says(w.message, "nn.scan")
    assert not check_gathered_params([*one, _g("layers/1/up/kernel", 10)], 100, model="linen", scanned=False)
    # inside a scan the scanned layer is the one FSDP needs; what is gathered outside it is the excess
    [w] = check_gathered_params([_g("layers/up/kernel", 60, True), _g("head/kernel", 30)], 100, model="nnx",
                                scanned=True)
    assert w.bytes == 30 and "already run under nnx.scan" in w.message
    [w] = check_gathered_params([_g("layers/0/up/kernel", 40), _g("layers/1/up/kernel", 40)], 100, model="step",
                                scanned=False)
    assert "jax.lax.scan" in w.message and not _says(w.message, "nn.scan") and not _says(w.message, "nnx.scan")


def _graph(nodes: dict[int, Node], roots: dict[int, int], entry: int = 0) -> Graph:
    callers: dict[int, list[int]] = {}
    users: dict[int, list[int]] = {}
    for iid, n in nodes.items():
        for c in n.called:
            callers.setdefault(c, []).append(iid)
        for o in n.operands:
            users.setdefault(o, []).append(iid)
    return Graph(nodes, roots, callers, users, entry)


def test_a_collective_is_traced_to_the_argument_it_gathers_through_a_scans_loop():
    def node(opcode, operands=(), called=(), comp=0, number=0, index=0):
        return Node(opcode, "", tuple(operands), tuple(called), comp, number, index)

    g = _graph({
        # entry (0): the stacked weights (argument 0), the batch (argument 1), a loop over them, a computed value
        1: node("parameter", number=0), 2: node("parameter", number=1), 3: node("tuple", (1, 2)),
        4: node("while", (3,), (10, 20)), 5: node("convert", (1,)), 6: node("all-gather", (5,)),
        7: node("add", (1, 2)), 8: node("all-gather", (7,)),
        # body (10): slice one layer of the stack, gather it; gather the batch; pass both on unchanged
        11: node("parameter", comp=10), 12: node("get-tuple-element", (11,), comp=10, index=0),
        13: node("get-tuple-element", (11,), comp=10, index=1), 14: node("dynamic-slice", (12,), comp=10),
        15: node("all-gather", (14,), comp=10), 16: node("all-gather", (13,), comp=10),
        17: node("tuple", (12, 13), comp=10),
        # condition (20)
        21: node("parameter", comp=20), 22: node("compare", (21,), comp=20),
    }, {0: 4, 10: 17, 20: 22})
    assert g.argument(6) == (0, False)     # a parameter cast and gathered outside any loop
    assert g.argument(15) == (0, True)     # a scanned layer's slice of the stack the loop carries
    assert g.argument(16) == (1, False)    # the batch, carried whole: gathered in the loop, not a scan's layer
    assert g.argument(8) == (-1, False)    # computed: an activation, whatever it was made of

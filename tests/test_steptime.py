"""The step-time estimate: XLA's FLOPs and bytes with loops counted, custom calls, communication, the catalogue."""

from __future__ import annotations

import json

import pytest

from conftest import build_step
from jaxmem.compiler import kernels, steptime, targets
from jaxmem.compiler import rates as rates_mod
from jaxmem.xla import hlo_text
from jaxmem.xla.collectives import Collective


def _compile(model: str, **kw):
    """(optimized HLO text, options) of a deviceless H100 compile."""
    from jaxmem.compiler import compiled

    args = dict(kw.pop("model_args", ()))
    _, built = build_step(model, model_args=args, **kw)
    exe, _ = compiled.lower_and_compile(built)
    return exe.as_text()


def _llama(n_layers: int, remat: str = "none") -> str:
    return _compile("models/llama.py", mesh="data=1", layout="dp", remat=remat,
                    model_args=(("preset", "tiny"), ("n_layers", n_layers)))


@pytest.fixture(scope="module")
def llama_costs():
    """Loop-aware costs of the tiny scanned Llama with 2, 3 and 4 layers, and 2 layers under full remat."""
    out = {}
    for key, (n, remat) in {"2": (2, "none"), "3": (3, "none"), "4": (4, "none"), "2full": (2, "full")}.items():
        module = hlo_text.parse_module(_llama(n, remat))
        out[key] = (module, steptime.program_cost(module))
    return out


def test_flops_and_bytes_equal_xla_cost_analysis_for_a_loop_free_step():
    text = _compile("models/mlp.py", mesh="data=1", layout="dp", model_args=(("preset", "tiny"),))
    module = hlo_text.parse_module(text)
    assert module.trip_counts == {}  # no loops: XLA's own analysis counts every instruction once, correctly
    xla = steptime._xla_cost(text)
    cost = steptime.program_cost(module)
    assert cost.flops == xla["flops"] > 0
    assert cost.bytes_accessed == xla["bytes accessed"] > 0
    assert cost.custom_call_flops == 0


def test_loop_bodies_count_their_trip_count(llama_costs):
    f = {k: c.flops for k, (_, c) in llama_costs.items()}
    module, cost = llama_costs["4"]
    assert sorted(t for _, t in cost.loops) == [4, 4]  # the forward and backward layer loops
    # XLA's own number visits each loop body once, so it hardly grows with the layers
    assert llama_costs["4"][1].xla_flops - llama_costs["2"][1].xla_flops < 0.1 * llama_costs["2"][1].xla_flops
    # ours grows by one layer's FLOPs per layer: linear in the number of layers
    per_layer = f["3"] - f["2"]
    assert per_layer > 0
    assert f["4"] - f["2"] == pytest.approx(2 * per_layer, rel=1e-3)
    # and the layer loops are most of the step
    assert 4 * per_layer > 0.5 * f["4"]


def test_full_remat_reports_more_flops_than_none(llama_costs):
    none, full = llama_costs["2"][1].flops, llama_costs["2full"][1].flops
    assert full > none
    # recomputing the forward of the layers: at most one more forward pass (a third of fwd + bwd)
    assert full < none * 1.5


SYNTHETIC = """HloModule m

ENTRY %main (q: bf16[2,64,4,32], k: bf16[2,64,4,32], v: bf16[2,64,4,32], a: f32[16,32], b: f32[32,8]) -> f32[16,8] {
  %q = bf16[2,64,4,32]{3,2,1,0} parameter(0)
  %k = bf16[2,64,4,32]{3,2,1,0} parameter(1)
  %v = bf16[2,64,4,32]{3,2,1,0} parameter(2)
  %a = f32[16,32]{1,0} parameter(3)
  %b = f32[32,8]{1,0} parameter(4)
  %fwd = (bf16[2,4,64,32]{3,1,2,0}, f32[2,4,64]{2,1,0}, u8[0]{0}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"cudnn_fmha_backend_config": {"mask_type": "CAUSAL", "bmm1_dot_dimension_numbers": {"lhs_contracting_dimensions": ["3"], "rhs_contracting_dimensions": ["3"], "lhs_batch_dimensions": ["0", "2"], "rhs_batch_dimensions": ["0", "2"]}}}
  %bwd = (bf16[2,64,4,32]{3,2,1,0}, bf16[2,64,4,32]{3,2,1,0}, bf16[2,64,4,32]{3,2,1,0}, u8[0]{0}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmaxBackward", backend_config={"cudnn_fmha_backend_config": {"mask_type": "NO_MASK"}}
  %gemm = (f32[16,8]{1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config": {"dot_dimension_numbers": {"lhs_contracting_dimensions": ["1"], "rhs_contracting_dimensions": ["0"], "lhs_batch_dimensions": [], "rhs_batch_dimensions": []}}}
  ROOT %r = f32[16,8]{1,0} get-tuple-element(%gemm), index=0
}
"""


def test_custom_call_flops_from_shapes():
    m = hlo_text.parse_module(SYNTHETIC)
    by = m.by_name
    scores = 2 * 2 * 4 * 64 * 64 * 32  # Q·Kᵀ: 2 x batch x heads x Tq x Tk x head_dim
    assert steptime._custom_call_flops(m, by["fwd"]) == 2 * scores * 0.5  # two GEMMs, half of them masked
    assert steptime._custom_call_flops(m, by["bwd"]) == 5 * scores       # five GEMMs, no mask
    assert steptime._custom_call_flops(m, by["gemm"]) == 2 * 16 * 8 * 32


OFFLOADED = """HloModule m

ENTRY %main (p: f32[64,256], w: f32[1024]) -> f32[64,256] {
  %p = f32[64,256]{1,0:S(5)} parameter(0)
  %w = f32[1024]{0} parameter(1)
  %cs = (f32[64,256]{1,0:S(5)}, f32[64,256]{1,0}, u32[]) copy-start(%w2), backend_config={}
  %cd = f32[64,256]{1,0:S(5)} copy-done(%cs)
  %w2 = f32[64,256]{1,0} copy(%p)
  %local = f32[1024]{0} copy(%w)
  ROOT %r = f32[64,256]{1,0:S(5)} copy-done(%cs)
}
"""


def test_host_transfers_count_copies_to_host_memory_and_host_parameters():
    m = hlo_text.parse_module(OFFLOADED)
    # the host parameter read once, the copy out of it, the copy back to host; not the device-only copy
    assert steptime.host_transfer_bytes(m) == 3 * 64 * 256 * 4


def test_communication_follows_ring_algorithms_and_the_link_crossed():
    perf = targets.PERFORMANCE["h100"]
    ag = Collective("all-gather", 8_000, ((0, 1, 2, 3), (4, 5, 6, 7)), ("data",), 3)
    ar = Collective("all-reduce", 1_000, ((0, 8),), ("data",), 1)      # devices 0 and 8: two hosts of 8
    rs = Collective("reduce-scatter", 16_000, (tuple(range(16)),), ("data",), 1)  # 8 per host: 8 NICs each
    total, rows = steptime.communication([ag, ar, rs], perf, devices_per_host=8)
    t_ag = 3 * 8_000 * 3 / 4 / perf.intra_host_bandwidth
    t_ar = 1_000 * 2 * 1 / 2 / perf.inter_host_bandwidth
    t_rs = 16_000 * 15 / 16 / min(perf.intra_host_bandwidth, 8 * perf.inter_host_bandwidth)
    assert total == pytest.approx(t_ag + t_ar + t_rs, rel=1e-12)
    by_kind = {r["kind"]: r for r in rows}
    assert by_kind["all-gather"]["link"] == perf.intra_host_link and by_kind["all-reduce"]["link"] == "network"
    assert by_kind["all-gather"]["count"] == 3 and by_kind["all-gather"]["bytes"] == 24_000


def test_estimate_states_its_parts_band_and_sources(llama_costs):
    module, cost = llama_costs["2"]
    st = steptime.estimate(module, mesh_axes=(("data", 1),), hosts=1, gpu="h100")
    assert st["label"] == "estimate" and st["available"]
    assert st["flops"] == cost.flops
    # the fp32 Llama's dots run in TF32 (JAX's default precision on GPU); the rest on CUDA cores at fp32
    (kind, passes, dots), = cost.dot_flops
    assert (kind, passes) == ("tf32", 1) and 0 < dots < cost.flops
    assert [r["kind"] for r in st["compute_peaks"]] == ["tf32", "non-dot"]
    assert st["communication_s"] == 0 and st["collectives"] == []          # one device: nothing to communicate
    # one device, no collectives: the step is its kernels one after another, except XLA's async slice / update
    # fusions of the scan's stacks (fusion-start), which run beside them on a stream of their own
    perf = targets.PERFORMANCE["h100"]
    r = steptime.rates("h100", perf)
    beside = sum(steptime.kernel_time(k, perf, r) * k.runs for k in kernels.kernels(module)
                 if k.opcode == "fusion-start")
    busy = st["compute_s"] + st["memory_s"]
    if beside:
        assert busy - beside - 1e-12 <= st["estimate_s"] < busy
    else:   # an XLA that makes no async fusions of the stacks (jaxlib 0.10): one stream, one kernel after another
        assert st["estimate_s"] == pytest.approx(busy, rel=1e-9)
    assert st["overlap_slowdown_s"] == 0
    assert st["low_s"] < st["estimate_s"] < st["high_s"]
    classes = {c["class"]: c for c in st["kernel_classes"]}
    assert set(classes) == {"gemm", "memory"}
    assert sum(c["time_s"] for c in classes.values()) == pytest.approx(busy, rel=1e-9)
    # every kernel at least the launch floor: a tiny step is launch-bound, not free
    assert classes["memory"]["time_s"] >= classes["memory"]["launches"] * steptime.LAUNCH_FLOOR_S.central * 0.999
    assert st["bytes_accessed"] == pytest.approx(classes["gemm"]["bytes"] + classes["memory"]["bytes"])
    assert all(st["rate_sources"].values())


def _scan_dense(layers: int) -> hlo_text.Module:
    return hlo_text.parse_module(_compile("tests/fixtures/scan_dense.py", model_args=(("layers", layers),)))


def test_a_scanned_step_without_remat_moves_per_layer_bytes_a_hand_count_bounds():
    """A linen nn.scan of square f32 dense layers, no remat. Each layer's iteration reads its slice of
    the stacked (L, D, D) weights and its gradient is written into a stacked buffer: XLA's cost analysis
    charges the whole stack on every trip (bytes quadratic in L), the kernels move the slice."""
    from fixtures import scan_dense as sd
    from jaxmem.compiler import kernels

    ours, xla = {}, {}
    for n in (2, 4, 8):
        module = _scan_dense(n)
        ours[n] = kernels.bytes_per_step(kernels.kernels(module))
        xla[n] = steptime.program_cost(module).bytes_accessed
    per_layer = (ours[4] - ours[2]) / 2
    assert (ours[8] - ours[4]) / 4 == pytest.approx(per_layer, rel=0.01)      # linear in the layers
    # by hand, per layer, f32: the weight slice read forward and backward, its gradient written, the SGD
    # update reading weight and gradient and writing the weight (6 D x D arrays); the activations: forward
    # read x, write tanh(x W) and its saved copy, backward read the saved copy, the incoming and outgoing
    # gradients and x again for dW (8 B x D arrays at least)
    w, act = sd.D * sd.D * 4, sd.B * sd.D * 4
    hand = 6 * w + 8 * act
    # what the compiled kernels add on top (XLA's split-K partial sums, async slice copies) stays within 4x
    assert hand <= per_layer <= 4 * hand
    # XLA's own count charges each trip the whole stack: its per-layer bytes grow with the stack (jaxlib 0.12;
    # jaxlib 0.9's and 0.10.2's cost analysis grow linearly here: 4.1 MB per layer from 4 to 8 layers at 0.9,
    # 6.9 MB from 4 to 8 against 6.9 MB from 2 to 4 at 0.10.2)
    import jaxlib

    if tuple(int(x) for x in jaxlib.__version__.split(".")[:2]) >= (0, 12):
        assert (xla[8] - xla[4]) / 4 > 1.15 * (xla[4] - xla[2]) / 2
        assert (xla[8] - xla[4]) / 4 > 4 * hand


# An async all-gather whose start and done enclose a 2 x 4096^3 GEMM, and a synchronous all-reduce.
OVERLAP = """HloModule m, is_scheduled=true

%add (x: bf16[], y: bf16[]) -> bf16[] {
  %x = bf16[] parameter(0)
  %y = bf16[] parameter(1)
  ROOT %s = bf16[] add(%x, %y)
}

ENTRY %main (a: bf16[4096,4096], b: bf16[4096,4096], p: bf16[1048576]) -> bf16[4096,4096] {
  %a = bf16[4096,4096]{1,0} parameter(0)
  %b = bf16[4096,4096]{1,0} parameter(1)
  %p = bf16[1048576]{0} parameter(2)
  %ag = (bf16[1048576]{0}, bf16[8388608]{0}) all-gather-start(%p), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  %d = bf16[4096,4096]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %agd = bf16[8388608]{0} all-gather-done(%ag)
  %ar = bf16[4096,4096]{1,0} all-reduce(%d), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  ROOT %r = bf16[4096,4096]{1,0} copy(%ar)
}
"""


def test_an_async_collective_hides_behind_the_compute_scheduled_between_its_start_and_done():
    from jaxmem.compiler import kernels

    module = hlo_text.parse_module(OVERLAP)
    perf = targets.PERFORMANCE["h100"]
    r = steptime.rates("h100", perf)
    ks = kernels.kernels(module)
    colls = {c.name: c for c in steptime.collectives(module, (("data", 8),))}
    gemm = next(k for k in ks if k.klass == "gemm")
    copy = next(k for k in ks if k.name == "r")
    t_gemm, t_copy = steptime.kernel_time(gemm, perf, r), steptime.kernel_time(copy, perf, r)
    t_ag = steptime.collective_time(colls["ag"], perf, r, 8, r.nvls)[0]
    t_ar, link = steptime.collective_time(colls["ar"], perf, r, 8, r.nvls)
    assert t_ag < t_gemm            # the gather fits behind the GEMM
    assert "NVLS" in link            # an 8-GPU all-reduce inside an H100 host runs on NVLink SHARP
    st = steptime.estimate(module, mesh_axes=(("data", 8),), hosts=1, gpu="h100")
    # the gather is hidden, the synchronous all-reduce is not; the GEMM runs `slow` times longer while the
    # gather runs beside it (OVERLAP_SLOWDOWN: NCCL holds SMs and HBM bandwidth)
    slow = 1 + r.overlap_slowdown
    lost = t_ag * (1 - 1 / slow)
    assert r.overlap_slowdown == steptime.OVERLAP_SLOWDOWN.central > 0
    assert st["estimate_s"] == pytest.approx(t_gemm + lost + t_ar + t_copy, rel=1e-9)
    assert st["overlap_slowdown_s"] == pytest.approx(lost, rel=1e-9)
    assert st["exposed_communication_s"] == pytest.approx(t_ar, rel=1e-6)
    # the GEMM at the sustained (MSMF) share of the peak (4096 x 4096 fills its waves: 512 tiles on 132 SMs, 97%)
    assert t_gemm == pytest.approx(2 * 4096**3 / (perf.bf16_flops * r.gemm_fraction * 512 / (4 * 132)), rel=1e-9)


def test_each_rate_constant_names_its_public_source_and_orders_its_band():
    rates = [*steptime.GEMM_FRACTION.values(), *steptime.FP8_GEMM_FRACTION.values(), steptime.ATTENTION_FWD_FRACTION, steptime.ATTENTION_BWD_FRACTION,
             steptime.HBM_FRACTION, steptime.LAUNCH_FLOOR_S, steptime.NVLINK_FRACTION,
             steptime.NVLS_ALLREDUCE_FRACTION, steptime.NETWORK_FRACTION, *steptime.COLLECTIVE_LATENCY_S.values(),
             steptime.OVERLAP_SLOWDOWN]
    for r in rates:
        assert r.low <= r.central <= r.high and len(r.source) > 20
    perf = targets.PERFORMANCE["h100"]
    fast, slow = steptime.rates("h100", perf, "fast"), steptime.rates("h100", perf, "slow")
    assert fast.gemm_fraction > slow.gemm_fraction and fast.hbm > slow.hbm and fast.launch_s < slow.launch_s
    assert fast.fp8_gemm_fraction > slow.fp8_gemm_fraction


FP8_DOT = """HloModule m

ENTRY %main (a: f8e4m3fn[4096,4096], b: f8e4m3fn[4096,4096]) -> bf16[4096,4096] {
  %a = f8e4m3fn[4096,4096]{1,0} parameter(0)
  %b = f8e4m3fn[4096,4096]{1,0} parameter(1)
  ROOT %d = bf16[4096,4096]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_gemms_run_at_the_sustained_not_the_burst_matmul_rate_and_fp8_at_its_own_share():
    # a training step holds the board at its power limit: a node of 8 H200s sustains 727 of 989.4 TFLOPS
    # (mamf-finder's MSMF, the slowest GPU), below the 794.5 short-burst MAMF of the same die
    h100 = steptime.rates("h100", targets.PERFORMANCE["h100"])
    assert h100.gemm_fraction == pytest.approx(727 / 989.4) and h100.gemm_fraction < 794.5 / 989.4
    # FP8: its own (lower) MAMF share, held to the same sustained / burst ratio; Ampere's from its power-limit clock
    assert h100.fp8_gemm_fraction == pytest.approx(1402.6 / 1979 * 727 / 794.5)
    a100 = steptime.rates("a100-80g", targets.PERFORMANCE["a100-80g"])
    assert a100.gemm_fraction == pytest.approx(271.2 / 312 * 1305 / 1410)
    ks = kernels.kernels(hlo_text.parse_module(FP8_DOT))
    gemm = next(k for k in ks if k.klass == "gemm")
    assert gemm.dot_kind[0] == "fp8"
    perf = targets.PERFORMANCE["h100"]
    t = steptime.kernel_time(gemm, perf, h100)
    # 4096^3 on 132 SMs: 512 tiles of 128 x 256 fill 97% of 4 waves
    assert t == pytest.approx(2 * 4096**3 / (perf.fp8_flops * h100.fp8_gemm_fraction * 512 / (4 * 132)), rel=1e-9)


# A loop of known trip count whose body starts an async dynamic-slice fusion (XLA's async slices of a stacked
# buffer) before a GEMM and waits for it after: the slice runs on its own stream behind the GEMM, and the
# loop's condition is never launched (XLA:GPU's WhileThunk runs a known trip count without it).
ASYNC_LOOP = """HloModule m, is_scheduled=true

%slice (p0: bf16[4,512,512], p1: s32[]) -> bf16[1,512,512] {
  %p0 = bf16[4,512,512]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = bf16[1,512,512]{2,1,0} dynamic-slice(%p0, %p1, %z, %z), dynamic_slice_sizes={1,512,512}
}

%cmp (q: s32[]) -> pred[] {
  %q = s32[] parameter(0)
  %k = s32[] constant(4)
  ROOT %lt = pred[] compare(%q, %k), direction=LT
}

%cn (c: (s32[], bf16[4,512,512], bf16[2048,2048])) -> pred[] {
  %c = (s32[], bf16[4,512,512]{2,1,0}, bf16[2048,2048]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  ROOT %f = pred[] fusion(%i), kind=kLoop, calls=%cmp
}

%bd (b: (s32[], bf16[4,512,512], bf16[2048,2048])) -> (s32[], bf16[4,512,512], bf16[2048,2048]) {
  %b = (s32[], bf16[4,512,512]{2,1,0}, bf16[2048,2048]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%b), index=0
  %stack = bf16[4,512,512]{2,1,0} get-tuple-element(%b), index=1
  %x = bf16[2048,2048]{1,0} get-tuple-element(%b), index=2
  %fs = ((bf16[4,512,512], s32[]), bf16[1,512,512], u32[]) fusion-start(%stack, %i), kind=kLoop, calls=%slice
  %d = bf16[2048,2048]{1,0} dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %fd = bf16[1,512,512]{2,1,0} fusion-done(%fs)
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  ROOT %t = (s32[], bf16[4,512,512]{2,1,0}, bf16[2048,2048]{1,0}) tuple(%n, %stack, %d)
}

ENTRY %main (s: bf16[4,512,512], x: bf16[2048,2048]) -> bf16[2048,2048] {
  %s = bf16[4,512,512]{2,1,0} parameter(0)
  %x = bf16[2048,2048]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[4,512,512]{2,1,0}, bf16[2048,2048]{1,0}) tuple(%zero, %s, %x)
  %w = (s32[], bf16[4,512,512], bf16[2048,2048]) while(%init), condition=%cn, body=%bd, backend_config={"known_trip_count":{"n":"4"}}
  ROOT %r = bf16[2048,2048]{1,0} get-tuple-element(%w), index=2
}
"""


def test_an_async_fusion_hides_behind_the_gemm_and_a_known_trip_count_launches_no_condition():
    module = hlo_text.parse_module(ASYNC_LOOP)
    assert module.trip_counts == {"w": 4}
    perf = targets.PERFORMANCE["h100"]
    r = steptime.rates("h100", perf)
    ks = kernels.kernels(module)
    assert {k.name for k in ks} == {"fs", "d", "n"}      # no kernel of the condition
    by = {k.name: k for k in ks}
    t = {n: steptime.kernel_time(k, perf, r) for n, k in by.items()}
    assert t["fs"] < t["d"]
    st = steptime.estimate(module, mesh_axes=(("data", 1),), hosts=1, gpu="h100")
    # per trip: the GEMM and the add on the compute stream; the slice beside them, waited for at its done
    assert st["estimate_s"] == pytest.approx(4 * (t["d"] + t["n"]), rel=1e-9)
    # with the slice charged on the compute stream (as before), the step would be longer by its time
    assert st["estimate_s"] < 4 * (t["d"] + t["n"] + t["fs"])


# One dot per way the compiled program says how it computes: operand types, operand_precision, algorithm,
# and a cuBLAS GEMM whose backend config asks for HIGHEST. Each is 2 x 16 x 8 x 32 = 8192 FLOPs.
DOTS = """HloModule m

ENTRY %main (a: f32[16,32], b: f32[32,8], c: bf16[16,32], d: bf16[32,8], e: f16[16,32], f: f16[32,8], g: f8e4m3fn[16,32], h: f8e4m3fn[32,8], i: s8[16,32], j: s8[32,8]) -> f32[16,8] {
  %a = f32[16,32]{1,0} parameter(0)
  %b = f32[32,8]{1,0} parameter(1)
  %c = bf16[16,32]{1,0} parameter(2)
  %d = bf16[32,8]{1,0} parameter(3)
  %e = f16[16,32]{1,0} parameter(4)
  %f = f16[32,8]{1,0} parameter(5)
  %g = f8e4m3fn[16,32]{1,0} parameter(6)
  %h = f8e4m3fn[32,8]{1,0} parameter(7)
  %i = s8[16,32]{1,0} parameter(8)
  %j = s8[32,8]{1,0} parameter(9)
  %tf32 = f32[16,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %highest = f32[16,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={highest,highest}
  %high = f32[16,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={high,high}
  %x3 = f32[16,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, algorithm=dot_bf16_bf16_f32_x3
  %bf16 = f32[16,8]{1,0} dot(%c, %d), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %fp16 = f32[16,8]{1,0} dot(%e, %f), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %fp8 = f32[16,8]{1,0} dot(%g, %h), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %int8 = s32[16,8]{1,0} dot(%i, %j), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %gemm = (f32[16,8]{1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config": {"dot_dimension_numbers": {"lhs_contracting_dimensions": ["1"], "rhs_contracting_dimensions": ["0"], "lhs_batch_dimensions": [], "rhs_batch_dimensions": []}, "precision_config": {"operand_precision": ["HIGHEST", "HIGHEST"], "algorithm": "ALG_UNSET"}}}
  ROOT %r = f32[16,8]{1,0} get-tuple-element(%gemm), index=0
}
"""


def test_each_dot_is_costed_at_the_peak_of_its_operand_types_and_precision():
    m = hlo_text.parse_module(DOTS)
    one = 2 * 16 * 8 * 32
    assert dict(((k, p), f) for k, p, f in steptime.dot_flops(m)) == {
        ("tf32", 1): 2 * one, ("fp32", 1): 2 * one, ("bf16", 3): one, ("bf16", 1): one, ("fp16", 1): one,
        ("fp8", 1): one, ("int8", 1): one}
    h100, a100 = targets.PERFORMANCE["h100"], targets.PERFORMANCE["a100-80g"]
    cost = steptime.ProgramCost(flops=9 * one, bytes_accessed=0, transcendentals=0, xla_flops=8 * one,
                                custom_call_flops=one, dot_flops=steptime.dot_flops(m))
    rows = {(r["kind"], r["passes"]): r for r in steptime.compute_peaks(cost, h100)}
    assert rows[("fp8", 1)]["peak_flops"] == h100.fp8_flops and rows[("int8", 1)]["peak_flops"] == h100.int8_ops
    assert rows[("bf16", 3)]["time_s"] == 3 * one / h100.bf16_flops   # three bf16 passes per fp32 dot
    assert sum(r["time_s"] for r in rows.values()) == pytest.approx(
        2 * one / h100.tf32_flops + 2 * one / h100.fp32_flops + 5 * one / h100.bf16_flops
        + one / h100.fp8_flops + one / h100.int8_ops, rel=1e-12)
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0, rel=1e-12)   # no non-dot FLOPs here
    # the A100 has no fp8 tensor cores: its fp8 dots are costed at the bf16 rate, and say so
    fp8 = next(r for r in steptime.compute_peaks(cost, a100) if r["kind"] == "fp8")
    assert fp8["peak_flops"] == a100.bf16_flops and "not on this card" in fp8["label"]


def _st(model: str, **kw) -> dict:
    text = _compile(model, mesh="data=1", layout="dp", **kw)
    return steptime.estimate(text, mesh_axes=(("data", 1),), hosts=1, gpu="h100")


def test_a_model_computing_in_bf16_by_its_own_dtype_has_its_dots_costed_as_bf16_whatever_the_precision_flag():
    fp32, bf16 = (_st("tests/fixtures/scan_bf16.py", precision=p) for p in ("fp32", "bf16"))
    dots = [{k: r[k] for k in ("kind", "passes", "flops", "peak_flops", "time_s")}
            for s in (fp32, bf16) for r in s["compute_peaks"] if r["kind"] != "non-dot"]
    assert dots[0] == dots[1] and dots[0]["kind"] == "bf16" and len(dots) == 2   # every dot bf16, the same
    # --precision bf16 only casts the fp32 weights in the step (element-wise work): the GEMM kernels, bf16 in
    # both, take the same time
    assert fp32["compute_s"] == pytest.approx(bf16["compute_s"], rel=1e-9) and fp32["compute_s"] > 0


def test_no_estimate_off_the_catalogue():
    st = steptime.estimate("HloModule m", mesh_axes=(("data", 1),), hosts=1, gpu="cpu")
    assert st["available"] is False and "cpu" in st["reason"]


def test_every_catalogue_gpu_has_sourced_peak_rates_in_gpus_json():
    from click.testing import CliRunner

    from jaxmem.cli import main

    res = CliRunner().invoke(main, ["gpus", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert {r["name"] for r in rows} == set(targets.CATALOGUE)
    for r in rows:
        p = r["performance"]
        for field in ("bf16_flops", "tf32_flops", "fp32_flops", "hbm_bandwidth", "intra_host_bandwidth",
                      "inter_host_bandwidth"):
            assert p[field] > 0
            assert any(field in s["fields"] for s in p["sources"]), (r["name"], field)
        # GeForce cards' TF32 tensor rate equals their FP32 CUDA-core rate (Ada whitepaper: 82.6 and 82.6 on the 4090)
        assert p["bf16_flops"] > p["tf32_flops"] >= p["fp32_flops"]
        for field in ("fp8_flops", "int8_ops"):   # only where the card has them (no fp8 before Hopper)
            assert p[field] is None or (p[field] > p["bf16_flops"] and any(field in s["fields"] for s in p["sources"]))
    h100 = next(r for r in rows if r["name"] == "h100")["performance"]
    assert (h100["bf16_flops"], h100["fp32_flops"]) == (989.4e12, 66.9e12)  # the H100 SXM datasheet, dense
    assert (h100["fp8_flops"], h100["int8_ops"]) == (1978.9e12, 1978.9e12)


ALL_REDUCE_16 = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[1048576]) -> f32[1048576] {
  %p = f32[1048576]{0} parameter(0)
  ROOT %ar = f32[1048576]{0} all-reduce(%p), replica_groups={{0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15}}, to_apply=%add
}
"""


@pytest.mark.parametrize("gpu", ["gb200", "gh200"])
def test_a_collective_inside_an_nvlink_domain_that_spans_hosts_runs_at_the_nvlink_rate(gpu):
    # 16 GPUs on 2 hosts: the H100's all-reduce crosses the network; GB200 NVL72's and DGX GH200's stay on NVLink
    kw = dict(mesh_axes=(("data", 16),), hosts=2)
    h100, spans = (steptime.estimate(ALL_REDUCE_16, gpu=g, **kw) for g in ("h100", gpu))
    perf = targets.PERFORMANCE[gpu]
    assert [r["link"] for r in h100["collectives"]] == ["network"]
    assert [r["link"] for r in spans["collectives"]] == [perf.intra_host_link + " (NVLS)"]   # NVLink SHARP
    r = steptime.rates(gpu, perf)
    assert spans["communication_s"] == pytest.approx(
        r.latency_intra_s + 4 * 2**20 * 2 * 15 / 16 / (perf.intra_host_bandwidth * r.nvls_fraction), rel=1e-12)
    assert spans["communication_s"] < h100["communication_s"]


TO_HOST = """HloModule m

ENTRY %main (p: f32[64,256]) -> f32[64,256] {
  %p = f32[64,256]{1,0} parameter(0)
  ROOT %c = f32[64,256]{1,0:S(5)} copy(%p)
}
"""


def test_grace_superchips_move_offloaded_bytes_over_nvlink_c2c_not_pcie():
    per = {g: steptime.estimate(TO_HOST, mesh_axes=(("data", 1),), hosts=1, gpu=g)["host_transfer_s"]
           for g in ("h100", "gh200", "gb200")}
    moved = 64 * 256 * 4
    assert per == pytest.approx({"h100": moved / 64e9, "gh200": moved / 450e9, "gb200": moved / 225e9}, rel=1e-12)


FP8_GEMM = """HloModule m

ENTRY %main (a: f8e4m3fn[16,64], b: f8e4m3fn[32,64], s: f32[]) -> bf16[16,32] {
  %a = f8e4m3fn[16,64]{1,0} parameter(0)
  %b = f8e4m3fn[32,64]{1,0} parameter(1)
  %s = f32[] parameter(2)
  %g = (bf16[16,32]{1,0}, s8[33554432]{0}) custom-call(%a, %b, %s, %s, %s, %s), custom_call_target="__cublas$lt$matmul$f8", backend_config={"gemm_backend_config": {"dot_dimension_numbers": {"lhs_contracting_dimensions": ["1"], "rhs_contracting_dimensions": ["1"], "lhs_batch_dimensions": [], "rhs_batch_dimensions": []}}}
  ROOT %r = bf16[16,32]{1,0} get-tuple-element(%g), index=0
}
"""


def test_cublaslt_fp8_gemms_are_costed_as_fp8_dots():
    # XLA turns FP8 dots of GEMM size into __cublas$lt$matmul$f8 calls: their FLOPs are the dot's, at the fp8 rate
    m = hlo_text.parse_module(FP8_GEMM)
    assert steptime.dot_flops(m) == (("fp8", 1, 2.0 * 16 * 32 * 64),)


def test_the_cost_kept_with_the_printed_text_is_used_not_parsed_again():
    """The caller passes the XLA cost the compile kept with its text (Artifacts.cost): the entry's cost is
    that one, not the text parsed back (jaxlib 0.12 cannot parse all it prints); a whole compile's
    cost_analysis() has other keys and is not taken for it."""
    m = hlo_text.parse_module(ALL_REDUCE_16)
    kept = {"flops": 1e9, "bytes accessed": 5e6, "transcendentals": 0.0}
    cost = steptime.program_cost(m, steptime.whole_cost(kept))
    assert cost.xla_flops == 1e9 and cost.bytes_accessed == 5e6
    assert steptime.program_cost(m).xla_flops != 1e9   # without it: the text's own cost
    assert steptime.whole_cost({**kept, "utilization0{}": 1.0}) is None
    st = steptime.estimate(m, mesh_axes=(("data", 1),), hosts=1, gpu="h100", whole_cost=kept)
    assert st["xla_flops_loops_once"] == 1e9 and st["xla_bytes_accessed"] == 5e6


def test_a_ring_collective_pays_nccl_latency_per_ring_step_more_between_hosts():
    # NCCL's tuning model: base + one hop latency per ring step, the steps between hosts at the network's
    perf = targets.PERFORMANCE["h100"]
    r = steptime.rates("h100", perf)
    st = steptime.estimate(ALL_REDUCE_16, mesh_axes=(("data", 16),), hosts=2, gpu="h100")
    (row,) = st["collectives"]
    assert row["link"] == "network"
    steps, inter = 2 * 15, 2 * 1       # a 16-rank ring all-reduce over 2 hosts
    latency = rates_mod.RING_BASE_LATENCY_S + (steps - inter) * r.ring_step_intra_s + inter * r.ring_step_network_s
    wire = 4 * 2**20 * 2 * 15 / 16
    busbw = min(perf.intra_host_bandwidth, 8 * perf.inter_host_bandwidth) * r.network_fraction
    assert st["communication_s"] == pytest.approx(latency + wire / busbw, rel=1e-12)
    assert r.ring_step_network_s > r.ring_step_intra_s
    # the same bytes in a 32-rank ring over 4 hosts wait longer
    assert latency < rates_mod.RING_BASE_LATENCY_S + 56 * r.ring_step_intra_s + 6 * r.ring_step_network_s


def test_the_per_iteration_reduction_check_reads_only_data_axes_repeated_every_iteration():
    roles = {"data": {"role": "data"}, "stage": {"role": "stage"}, "tensor": {"role": "tensor"}}

    def st(*colls):
        return {"available": True, "estimate_s": 10.0, "pipeline": {"iterations": 9},
                "collectives": [{"kind": k, "axes": a, "count": n, "bytes": 1e9, "time_s": 0.5} for k, a, n in colls]}

    warned = steptime.check_pipeline_reductions(st(("all-reduce", ["data"], 18), ("all-reduce", ["tensor"], 90)), roles)
    assert [w.kind for w in warned] == ["gradient_reduced_per_iteration"]
    assert "18 collectives, 1.0 GB per device per step, 0.5 s" in warned[0].message and "1/9" in warned[0].message
    # once per step (sunk out of the loop), on the tensor axis, or no pipeline: nothing to say
    assert steptime.check_pipeline_reductions(st(("all-reduce", ["data"], 1)), roles) == []
    assert steptime.check_pipeline_reductions(st(("all-reduce", ["tensor"], 90)), roles) == []
    assert steptime.check_pipeline_reductions({**st(("all-reduce", ["data"], 18)), "pipeline": None}, roles) == []


def test_unoverlapped_collectives_are_the_synchronous_ones_and_the_async_pairs_with_no_kernel_between():
    # OVERLAP: the gather has the GEMM between its start and done, the all-reduce is synchronous
    module = hlo_text.parse_module(OVERLAP)
    perf = targets.PERFORMANCE["h100"]
    r = steptime.rates("h100", perf)
    colls = {c.name: c for c in steptime.collectives(module, (("data", 8),))}
    t_ag = steptime.collective_time(colls["ag"], perf, r, 8, r.nvls)[0]
    t_ar = steptime.collective_time(colls["ar"], perf, r, 8, r.nvls)[0]
    st = steptime.estimate(module, mesh_axes=(("data", 8),), hosts=1, gpu="h100")
    assert st["unoverlapped_collective_s"] == pytest.approx(t_ar, rel=1e-9)
    # the same program with the GEMM moved after the gather's done (as XLA leaves it without a latency-hiding
    # schedule): the pair hides nothing, and the whole communication is unoverlapped and exposed
    lines = OVERLAP.splitlines()
    dot = next(ln for ln in lines if " dot(" in ln)
    moved = [ln for ln in lines if ln != dot]
    moved.insert(next(i for i, ln in enumerate(moved) if "all-gather-done" in ln) + 1, dot)
    alone = steptime.estimate(hlo_text.parse_module("\n".join(moved)), mesh_axes=(("data", 8),), hosts=1,
                              gpu="h100")
    assert alone["unoverlapped_collective_s"] == pytest.approx(t_ag + t_ar, rel=1e-9)
    assert alone["exposed_communication_s"] == pytest.approx(t_ag + t_ar, rel=1e-6)



@pytest.fixture(scope="module")
def quantized_bases():
    """(step_time, bytes of integer codes among the step's parameters) of the tiny scanned Llama under LoRA, its
    frozen base in bf16, int8 and NF4, --remat full (the forward runs twice)."""
    out = {}
    for base in ("bf16", "int8", "nf4"):
        text = _compile("models/llama.py", mesh="data=1", layout="dp", model_args=(("preset", "tiny"),),
                        remat="full", precision="bf16", lora_rank=4, base_dtype=base)
        module = hlo_text.parse_module(text)
        entry = module.computations[module.entry]
        codes = sum(a.bytes for ins in entry.instructions if ins.opcode == "parameter"
                    for a in kernels._arrays(ins.shape) if a.dtype in kernels.QUANTIZED_CODES)
        out[base] = (steptime.estimate(module, mesh_axes=(("data", 1),), hosts=1, gpu="h100"), codes)
    return out


def test_a_quantized_bases_decoding_is_counted_per_matmul_forward_remat_and_backward(quantized_bases):
    st, codes = quantized_bases["bf16"]
    assert st["dequantization"] is None and codes == 0   # a 16-bit base is read as it is stored: nothing to decode
    for base in ("int8", "nf4"):
        st, codes = quantized_bases[base]
        dq = st["dequantization"]
        assert codes > 0 and dq is not None and dq["separate_launches"] + dq["in_gemm_launches"] > 0
        # each matmul decodes the weight it uses: the forward, the remat's forward and the backward's input
        # gradient read every code (the embedding's codes at least once: a gather, not a matmul)
        assert 2 * codes < dq["code_bytes"] <= 3 * codes, (dq, codes)
        if dq["separate_launches"]:
            assert dq["separate_s"] > 0 and dq["separate_bytes"] > dq["code_bytes"]   # floats written, too
    assert quantized_bases["int8"][1] == 2 * quantized_bases["nf4"][1]   # 8-bit codes: twice the 4-bit bytes

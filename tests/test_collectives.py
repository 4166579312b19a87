"""Collectives read from optimized HLO text: kinds, bytes, replica groups -> mesh axes, loop counts."""

from __future__ import annotations

import pytest

from conftest import build_step
from jaxmem.xla import hlo_text
from jaxmem.xla.collectives import collectives

MESH_2D = (("data", 4), ("model", 2))

# A hand-written module in the printed form of XLA:GPU's optimized HLO: a loop of known trip
# count holding an async all-gather, and every replica-group notation XLA prints.
SYNTHETIC = """HloModule jit_step, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%cond (p: (s32[], f32[16,8])) -> pred[] {
  %p = (s32[], f32[16,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(6)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p.1: (s32[], f32[16,8])) -> (s32[], f32[16,8]) {
  %p.1 = (s32[], f32[16,8]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %w = f32[16,8]{1,0} get-tuple-element(%p.1), index=1
  %ag = ((f32[16,8]{1,0}), f32[64,8]{1,0}) all-gather-start(%w), channel_id=1, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, use_global_device_ids=true
  %agd = f32[64,8]{1,0} all-gather-done(%ag)
  ROOT %t = (s32[], f32[16,8]{1,0}) tuple(%i.1, %w)
}

ENTRY %main (a: f32[16,8], b: bf16[32]) -> f32[16,8] {
  %a = f32[16,8]{1,0} parameter(0)
  %b = bf16[32]{0} parameter(1)
  %z = s32[] constant(0)
  %init = (s32[], f32[16,8]{1,0}) tuple(%z, %a)
  %loop = (s32[], f32[16,8]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"6"}}
  %ar = bf16[32]{0} all-reduce(%b), channel_id=2, replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true, to_apply=%add
  %rs = f32[4,8]{1,0} reduce-scatter(%a), channel_id=3, replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}, dimensions={0}, use_global_device_ids=true, to_apply=%add
  %rs2 = f32[4,8]{1,0} reduce-scatter(%a), channel_id=6, replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}, dimensions={0}, use_global_device_ids=true, to_apply=%add
  %cp = f32[16,8]{1,0} collective-permute(%a), channel_id=4, source_target_pairs={{0,2},{2,4},{4,6},{6,0}}
  %a2a = f32[16,8]{1,0} all-to-all(%a), channel_id=5, replica_groups={}, dimensions={0}
  ROOT %r = f32[16,8]{1,0} get-tuple-element(%loop), index=1
}
"""


def _by_name(cs):
    return {c.name: c for c in cs}


def test_kinds_bytes_and_loop_counts_of_a_synthetic_module():
    cs = _by_name(collectives(SYNTHETIC, MESH_2D))
    assert set(cs) == {"ag", "ar", "rs", "rs2", "cp", "a2a"}  # the -done of the async pair is not a second collective
    ag = cs["ag"]
    assert (ag.kind, ag.bytes, ag.count_in_loop, ag.bytes_per_step) == ("all-gather", 64 * 8 * 4, 6, 6 * 64 * 8 * 4)
    assert ag.computation == "body"
    assert (cs["ar"].kind, cs["ar"].bytes, cs["ar"].count_in_loop) == ("all-reduce", 64, 1)
    # reduce-scatter: the input before scattering, 4 devices x the (4, 8) f32 result
    assert (cs["rs"].kind, cs["rs"].bytes) == ("reduce-scatter", 4 * 4 * 8 * 4)
    assert cs["cp"].bytes == cs["a2a"].bytes == 16 * 8 * 4


def test_replica_group_notations_resolve_to_mesh_axes():
    cs = _by_name(collectives(SYNTHETIC, MESH_2D))
    # iota [2,4]<=[4,2]T(1,0): {0,2,4,6},{1,3,5,7}: the data coordinate varies, model is fixed
    assert cs["ag"].replica_groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert cs["ag"].axes == ("data",)
    # explicit {{0,1},...}: neighbours in row-major order differ on the model axis
    assert cs["ar"].replica_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert cs["ar"].axes == ("model",)
    # XLA's named-mesh notation, its own axis names: axis_0 (size 4) is our data axis
    assert cs["rs"].replica_groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert cs["rs"].axes == ("data",)
    # the named mesh over permuted devices (HSDP's data=2,fsdp=4): device_ids=([2,4]T(1,0)) lists the
    # mesh's devices as 0,4,1,5,2,6,3,7, so axis_0 (size 4) runs over {0,1,2,3} and {4,5,6,7}: fsdp
    assert cs["rs2"].replica_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert _by_name(collectives(SYNTHETIC, (("data", 2), ("fsdp", 4))))["rs2"].axes == ("fsdp",)
    # no groups: every device
    assert cs["a2a"].replica_groups == (tuple(range(8)),)
    assert cs["a2a"].axes == ("data", "model")
    assert cs["cp"].replica_groups == ((0, 2), (2, 4), (4, 6), (6, 0))
    assert cs["cp"].axes == ("data",)


def test_loop_multiplicity_and_trip_counts():
    m = hlo_text.parse_module(SYNTHETIC)
    assert m.entry == "main"
    assert m.trip_counts == {"loop": 6}
    assert m.multiplicity["body"] == 6 and m.multiplicity["cond"] == 7 and m.multiplicity["main"] == 1


def test_shapes_parse_tuples_and_sub_byte_types():
    s = hlo_text.parse_shape("((f32[16]{0}, /*index=1*/bf16[2,3]{1,0}), s4[8]{0}, pred[])")
    assert hlo_text.shape_bytes(s) == 16 * 4 + 6 * 2 + 4 + 1


@pytest.fixture(scope="module")
def tiny_llama_fsdp():
    """Compiled HLO of the tiny scanned Llama (4 layers, fp32) under fsdp on 4 H100s, and its leaves."""
    from jaxmem.compiler import compiled

    _, built = build_step("models/llama.py", gpu="h100", mesh="data=4", layout="fsdp",
                          model_args={"preset": "tiny", "n_layers": 4})
    exe, _ = compiled.lower_and_compile(built)
    return exe.as_text(), built


def test_fsdp_gathers_one_layer_of_weights_per_iteration_of_the_scanned_loop(tiny_llama_fsdp):
    text, built = tiny_llama_fsdp
    cs = collectives(text, (("data", 4),))
    layer_bytes = sum(leaf.global_bytes for leaf in built.leaves
                      if leaf.category == "params" and leaf.path.startswith("params:layers/"))
    assert layer_bytes > 0
    assert all(c.axes == ("data",) for c in cs)
    # The forward layer loop gathers exactly the weights of one layer per iteration, 4 times.
    m = hlo_text.parse_module(text)
    forward_loops = {c.computation for c in cs if c.kind == "all-gather" and c.count_in_loop == 4}
    assert forward_loops
    per_loop = {comp: sum(c.bytes for c in cs if c.computation == comp and c.kind == "all-gather")
                for comp in forward_loops}
    # every loop gathers at least one layer's weights; the one that gathers only weights gathers exactly them
    assert min(per_loop.values()) == layer_bytes // 4
    assert all(v >= layer_bytes // 4 for v in per_loop.values())
    assert sum(c.bytes_per_step for c in cs if c.kind == "all-gather" and c.computation in forward_loops) \
        >= layer_bytes  # all layers, at least once per step
    assert all(m.multiplicity[comp] == 4 for comp in forward_loops)


def test_no_collectives_under_dp_on_one_device():
    from jaxmem.compiler import compiled

    _, built = build_step("models/llama.py", gpu="h100", mesh="data=1", layout="dp", model_args={"preset": "tiny"})
    exe, _ = compiled.lower_and_compile(built)
    assert collectives(exe.as_text(), (("data", 1),)) == []


def test_hsdp_collectives_span_their_mesh_axes_and_are_costed():
    """HSDP (data=2, fsdp=4): XLA names its groups on a mesh of permuted devices; every collective
    that moves data between devices is attributed to the axes it spans (the FSDP all-gathers and
    reduce-scatters to fsdp, the gradient all-reduce to data) and so costed in the step time."""
    from jaxmem.compiler import compiled

    _, built = build_step("models/llama.py", gpu="h100", mesh="data=2,fsdp=4", layout="fsdp",
                          model_args={"preset": "tiny", "batch_size": 8})
    exe, _ = compiled.lower_and_compile(built)
    cs = collectives(exe.as_text(), (("data", 2), ("fsdp", 4)))
    moving = [c for c in cs if any(len(g) > 1 for g in c.replica_groups)]
    assert moving and all(c.axes for c in moving), [(c.name, c.axes) for c in moving if not c.axes]
    gathers = [c for c in cs if c.kind == "all-gather" and c.count_in_loop > 1]
    assert gathers and all(c.axes == ("fsdp",) for c in gathers)
    assert any(c.kind == "all-reduce" and c.axes == ("data",) for c in cs)

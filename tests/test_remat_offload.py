"""Activation offload: --remat offload_dots and offload:NAME,NAME keep what the policy saves in
pinned host memory (jaxmem.remat_policy; JAX's memory kinds). The report gives the host bytes per
device, the device activations drop by what moved, and the step time charges the traffic."""

from __future__ import annotations

import jax
import pytest
from jax.ad_checkpoint import checkpoint_name
from click.testing import CliRunner

import jaxmem
from jaxmem import cli
from jaxmem.compiler import steptime
from jaxmem.program import options
from jaxmem.xla import hlo_text

# a Llama small enough to compile in seconds whose saved activations dominate the peak, with many
# layers: the backward pass brings one layer's offloaded activations back onto the device at a time
LLAMA = {"preset": "tiny", "n_layers": 64, "d_model": 128, "ffn_dim": 512, "batch_size": 16, "seq_len": 256}
NAMES = "mlpwi_0,mlpwi_1,query_proj"


def _analyze(remat: str, **args):
    return jaxmem.analyze("models/llama.py", gpu="h100", precision="bf16", remat=remat, cache=False,
                          args={**LLAMA, **args})


def test_remat_policy_offload_names_are_jax_offload_policies():
    from jax._src.interpreters import partial_eval as pe

    dot = jax.make_jaxpr(lambda a, b: a @ b)(jax.numpy.ones((2, 2)), jax.numpy.ones((2, 2))).eqns[0]
    decision = jaxmem.remat_policy("offload_dots")(dot.primitive, **dot.params)
    assert isinstance(decision, pe.Offloadable) and decision.dst == "pinned_host"
    named = jaxmem.remat_policy("offload:a,b")
    eqn = jax.make_jaxpr(lambda x: checkpoint_name(x, "a"))(1.0).eqns[0]
    assert isinstance(named(eqn.primitive, **eqn.params), pe.Offloadable)
    other = jax.make_jaxpr(lambda x: checkpoint_name(x, "c"))(1.0).eqns[0]
    assert not isinstance(named(other.primitive, **other.params), pe.Offloadable)
    # save= keeps a name on the device on top of an offloading policy
    both = jaxmem.remat_policy("offload:a", save=["c"])
    assert both(other.primitive, **other.params) is True


@pytest.mark.parametrize("bad", ["offload:", "offload:a,,b", "offload_everything", "offload: "])
def test_a_malformed_offload_policy_is_exit_2_naming_it(bad):
    r = CliRunner().invoke(cli.main, ["analyze", "models/mlp.py", "--remat", bad])
    assert r.exit_code == 2 and "--remat" in r.output and "offload" in r.output


def test_compare_remats_keeps_the_names_of_an_offload_policy_together():
    assert options.split_remats(f"none,offload:{NAMES},full") == ["none", f"offload:{NAMES}", "full"]
    assert options.split_remats("offload:a,offload_dots") == ["offload:a", "offload_dots"]


def test_llama_refuses_an_offloaded_name_its_layers_do_not_give():
    r = CliRunner().invoke(cli.main, ["analyze", "models/llama.py", "--arg", "preset=tiny", "--remat", "offload:qkv"])
    assert r.exit_code == 2 and "qkv" in r.output and "query_proj" in r.output


def test_offload_on_the_cpu_backend_is_exit_2_before_any_compile():
    r = CliRunner().invoke(cli.main, ["analyze", "models/llama.py", "--arg", "preset=tiny", "--gpu", "cpu",
                                      "--remat", "offload_dots"])
    assert r.exit_code == 2 and "needs a GPU target" in r.output


@pytest.mark.parametrize("offload,on_device", [
    ("offload_dots", {"remat": "dots_with_no_batch_dims_saveable"}),
    (f"offload:{NAMES}", {"remat": "full", "remat_save": NAMES}),
])
def test_device_activations_drop_by_what_the_report_says_moved_to_the_host(offload, on_device):
    kept = _analyze(on_device["remat"], **({"remat_save": on_device["remat_save"]} if "remat_save" in on_device
                                          else {}))
    moved = _analyze(offload)
    host = moved.host["activations"]
    assert host > 0 and not kept.host
    drop = kept.breakdown["activations_and_temporaries"] - moved.breakdown["activations_and_temporaries"]
    assert drop >= 0.95 * host, (drop, host)
    # the state is where it was: only activations moved
    for k in ("params", "optimizer_state", "batch"):
        assert kept.breakdown[k] == moved.breakdown[k]
    # the step time charges the trip out and back at the H100's PCIe rate (64 GB/s each way)
    st = moved.step_time
    assert st["host_transfer_bytes"] == 2 * host
    assert st["host_transfer_s"] == pytest.approx(2 * host / 64e9)
    assert moved.to_json()["host"]["activations"] == host


def test_an_offload_policy_that_finds_nothing_to_offload_says_so():
    r = jaxmem.analyze("models/mlp.py", gpu="h100", remat="offload:nothing_named_so", cache=False,
                       args={"preset": "tiny"})
    assert not r.host
    assert any(w.kind == "remat_offloaded_nothing" for w in r.warnings)


def test_host_transfers_count_dynamic_slices_of_host_buffers():
    text = """HloModule m, entry_computation_layout={()->()}

%body (p: (s32[], f32[4,8]{1,0:S(5)}, f32[8]{0})) -> (s32[], f32[4,8]{1,0:S(5)}, f32[8]{0}) {
  %p = (s32[], f32[4,8]{1,0:S(5)}, f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %h = f32[4,8]{1,0:S(5)} get-tuple-element(%p), index=1
  %x = f32[8]{0} get-tuple-element(%p), index=2
  %u = f32[1,8]{1,0} bitcast(%x)
  %z = s32[] constant(0)
  %w = f32[4,8]{1,0:S(5)} dynamic-update-slice(%h, %u, %i, %z)
  %r = f32[1,8]{1,0} dynamic-slice(%h, %i, %z), dynamic_slice_sizes={1,8}
  %y = f32[8]{0} bitcast(%r)
  ROOT %t = (s32[], f32[4,8]{1,0:S(5)}, f32[8]{0}) tuple(%i, %w, %y)
}

%cond (q: (s32[], f32[4,8]{1,0:S(5)}, f32[8]{0})) -> pred[] {
  %q = (s32[], f32[4,8]{1,0:S(5)}, f32[8]{0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(4)
  ROOT %c = pred[] compare(%j, %n), direction=LT
}

ENTRY %main () -> () {
  %a = s32[] constant(0)
  %b = f32[4,8]{1,0:S(5)} constant({...})
  %x0 = f32[8]{0} constant({...})
  %init = (s32[], f32[4,8]{1,0:S(5)}, f32[8]{0}) tuple(%a, %b, %x0)
  %loop = (s32[], f32[4,8]{1,0:S(5)}, f32[8]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  ROOT %e = () tuple()
}
"""
    module = hlo_text.parse_module(text)
    # 4 iterations x (32 bytes written to the host + 32 read back)
    assert steptime.host_transfer_bytes(module) == 4 * (32 + 32)

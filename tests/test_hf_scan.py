"""--arg scan=false: a config.json decoder's layers as a Python loop (the program Hugging Face's Flax
models run) instead of nn.scan (the default), and the report saying which it compiled."""

from __future__ import annotations

import dataclasses
import math
import pathlib

import jax
import pytest

import jaxmem
from jaxmem import hf
from jaxmem.errors import UserError

FIX = pathlib.Path(__file__).parent / "fixtures" / "hf"


def _params(wl):
    return jax.eval_shape(lambda: wl.model.init(jax.random.key(0), wl.batch["tokens"]))


def _step_text(wl) -> str:
    """The training step's gradient as jax lowers it (StableHLO)."""
    params = _params(wl)
    return jax.jit(jax.grad(lambda p, b: wl.loss(wl.model.bind(p), b))).lower(params, wl.batch).as_text()


@pytest.mark.parametrize("family", ["llama", "gemma2", "mixtral"])
def test_loop_and_scan_have_the_same_parameters_and_only_the_scan_a_while_loop(family):
    arch = hf.load_arch(FIX / family / "config.json")
    scan = hf.build_workload(arch, batch_size=2, seq_len=16)
    loop = hf.build_workload(arch, batch_size=2, seq_len=16, scan=False)
    count = [sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(_params(wl))) for wl in (scan, loop)]
    assert count[0] == count[1] == hf.parameter_count(arch)
    # the loop's parameters are each layer's own (layers/0, layers/1, ...), the scan's stacked on a layers axis
    loop_keys = set(_params(loop)["params"]["layers"])
    assert loop_keys == {str(i) for i in range(arch.n_layers)}
    assert "stablehlo.while" in _step_text(scan)
    assert "stablehlo.while" not in _step_text(loop)


def test_a_scan_arg_that_is_not_a_bool_and_a_loop_too_long_to_unroll_are_user_errors():
    arch = hf.load_arch(FIX / "llama" / "config.json")
    with pytest.raises(UserError, match="--arg scan='no'; expected true"):
        hf.build_workload(arch, scan="no")
    many = dataclasses.replace(arch, n_layers=hf.MAX_UNROLLED_LAYERS + 1)
    with pytest.raises(UserError, match="--arg scan=false with 1,025 layers"):
        hf.build_workload(many, scan=False)
    hf.build_workload(many)   # the scan compiles one layer: as many layers are fine


def test_the_loop_frees_each_layers_residuals_where_the_scan_stacks_them_and_choices_say_which():
    args = {"batch_size": 2, "seq_len": 32}
    scan = jaxmem.analyze(str(FIX / "llama"), gpu="h100", args=args)
    loop = jaxmem.analyze(str(FIX / "llama"), gpu="h100", args={**args, "scan": False})
    assert scan.param_count == loop.param_count
    # remat none: the scan keeps every layer's residuals stacked (n_layers, ...) and a stacked gradient
    # carry, the loop holds each layer's own: a lower peak, as against HF's Flax loop models at scale
    assert loop.per_device_peak_bytes < scan.per_device_peak_bytes
    assert scan.choices["layers"] == "scan" and loop.choices["layers"] == "loop"
    assert "--arg scan=false" in scan.choices["layers_why"] and "--arg scan=false" in loop.choices["layers_why"]


def test_remat_applies_to_the_loop_as_to_the_scan():
    # each layer of the loop under its own remat keeps XLA's CSE from folding the recomputed forward back into
    # the forward (prevent_cse): --remat full holds less than none, as it does under the scan
    args = {"batch_size": 4, "seq_len": 256, "scan": False}
    held = {r: jaxmem.analyze(str(FIX / "llama"), gpu="h100", remat=r, args=args).breakdown[
        "activations_and_temporaries"] for r in ("none", "full")}
    assert held["full"] < held["none"], held

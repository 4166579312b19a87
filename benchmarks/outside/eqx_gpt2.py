"""An Equinox GPT-2 (tests/fixtures/eqx_gpt.py's modules, a tied head) at a chosen size, built with
jaxmem.equinox_workload: the benchmark's case of a vocabulary that does not divide the mesh (GPT-2's
50257 rows under 8 devices) against nanoGPT's padded 50304 (benchmarks/outside_rules.py).

    jaxmem analyze benchmarks/outside/eqx_gpt2.py --arg vocab=50257 --mesh data=8
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import jaxmem

_spec = importlib.util.spec_from_file_location(
    "eqx_gpt", pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "eqx_gpt.py")
gpt = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("eqx_gpt", gpt)   # dataclasses (eqx.Module) look their module up
_spec.loader.exec_module(gpt)


def workload(vocab: int = 50257, d: int = 768, heads: int = 12, layers: int = 12, seq: int = 1024,
             batch: int = 8) -> jaxmem.Workload:
    model = eqx.filter_eval_shape(gpt.GPT, jax.random.key(0), vocab, d, heads, layers, seq)
    data = {"tokens": jax.ShapeDtypeStruct((batch, seq), jnp.int32),
            "targets": jax.ShapeDtypeStruct((batch, seq), jnp.int32)}
    return jaxmem.equinox_workload(model, gpt.loss_fn, optax.adamw(3e-4), data)

"""Sizes XLA cannot express, refused before XLA compiles (jaxmem/program/sizes.py): a matmul's batch
dimensions past int32, loops too long to compile, and XLA's own wrapped-around dimension."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest

import jaxmem
from jaxmem.compiler import compiled
from jaxmem.errors import UserError
from jaxmem.program import pipeline_stages, sharding, sizes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(ROOT, "models", "llama.py")
MLP = os.path.join(ROOT, "tests", "fixtures", "mlp_small.py")
PRIME = 2147483629   # issue 47's batch: prime, below int32, twice it is not


def _dots(b: int):
    """The equations of a grouped-query attention score: batch dimensions (batch, kv heads = 2)."""
    q = jax.ShapeDtypeStruct((b, 2, 4, 16), jnp.float32)
    k = jax.ShapeDtypeStruct((b, 2, 4, 16), jnp.float32)
    return sharding.equations(jax.make_jaxpr(lambda q, k: jnp.einsum("bktd,bksd->bkts", q, k))(q, k))


def test_a_matmul_whose_batch_dimensions_multiply_past_int32_is_refused():
    with pytest.raises(UserError, match=r"runs 2,147,483,629 x 2 = 4,294,967,258 batches: XLA:GPU runs a matmul's "
                                        r"batch dimensions as one, of at most 2,147,483,647 \(int32\).*--batch"):
        sizes.check_dots(_dots(PRIME))
    sizes.check_dots(_dots(2**30 - 1))   # 2 x (2^30 - 1) batches fit in int32: XLA compiled it (DOES NOT FIT)


def test_the_issues_batch_is_exit_2_before_compiling(monkeypatch):
    # issue 47: `--batch 2147483629` on the tiny Llama ended in `jaxmem bug: Invalid dimension size -38`
    monkeypatch.setattr(compiled, "_compile_early", lambda *a, **k: pytest.fail("compiled"))
    monkeypatch.setattr(compiled, "_compile_whole", lambda *a, **k: pytest.fail("compiled"))
    with pytest.raises(UserError, match=r"2,147,483,629 x 2 = 4,294,967,258 batches.*use a smaller --batch"):
        jaxmem.analyze(LLAMA, args={"preset": "tiny"}, gpu="h100", batch=PRIME, cache=False)


def test_a_pipeline_of_more_microbatches_than_jaxmem_compiles_is_refused_at_planning():
    # issue 47: with --mesh stage=2 the prime batch was 2,147,483,629 microbatches of one: past 300 s compiling
    with pytest.raises(UserError, match=r"--mesh stage=2 with 2,147,483,629 microbatches \(the fewest that split it\): "
                                        r"the pipeline's loop runs 2,147,483,630 iterations.*at most 16,384; give "
                                        r"--microbatches M \(at least 2, at most 16,384\).*a multiple of 2"):
        pipeline_stages.resolve("gpipe", 2, None, None, PRIME, 1, "stage")
    with pytest.raises(UserError, match=r"--microbatches 16384: the pipeline's loop runs 16,385 iterations"):
        pipeline_stages.resolve("gpipe", 2, 16384, None, 2**20, 1, "stage")
    with pytest.raises(UserError, match=r"runs 32,771 iterations"):   # circular: M x R + N - 1
        pipeline_stages.resolve("circular", 4, 8192, 4, 2**20, 1, "stage")
    sched, _ = pipeline_stages.resolve("gpipe", 2, 16383, None, 16383 * 4, 1, "stage")   # 16,384 iterations
    assert sched.iterations == sizes.MAX_LOOP_ITERATIONS


def test_an_accumulation_loop_longer_than_jaxmem_compiles_is_refused_before_tracing(monkeypatch):
    monkeypatch.setattr(compiled, "lower", lambda *a, **k: pytest.fail("traced"))
    with pytest.raises(UserError, match=r"--accum 16385: the gradient accumulation loop runs 16,385 iterations.*"
                                        r"use a smaller --accum"):
        jaxmem.analyze(MLP, gpu="h100", batch=16385, accum=16385)


def test_a_dimension_xla_wrapped_around_is_a_user_error_naming_the_batch():
    e = RuntimeError("Bad StatusOr access: INVALID_ARGUMENT: Invalid dimension size -38, is_dynamic=false")
    err = sizes.compile_limit_error(e)
    assert isinstance(err, UserError)
    assert "past 2,147,483,647 (int32) and wrapped around to -38; use a smaller --batch" in str(err)
    assert sizes.compile_limit_error(RuntimeError("Invalid dimension size 5")) is None

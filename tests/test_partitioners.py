"""Custom-partitioned ops across the process boundary: what crosses the pipe round-trips, a
partitioning rule's failure names the rule, and the cache key is stable but rule-sensitive."""
import pathlib

import jax.numpy as jnp
import pytest
from jax._src.lib import xla_client as xc

from jaxmem.compiler import cache, compiled, early_stop, partitioners
from jaxmem.errors import UserError
from test_early_stop import FIXTURES, _built


def test_shapes_and_shardings_round_trip_through_the_pipe_encoding():
    bf16 = xc.Shape.array_shape(jnp.dtype("bfloat16"), (4, 8))
    values = [
        [bf16, xc.Shape.tuple_shape([bf16, xc.Shape.array_shape(jnp.dtype("int32"), ())])],
        (xc.HloSharding.iota_tile([2, 1]), xc.HloSharding.replicate()),
        b"140123", None,
    ]
    back = partitioners.decode(partitioners.encode(values))
    assert str(back[0][0]) == str(bf16) and back[0][0].numpy_dtype() == jnp.bfloat16
    assert back[0][1].is_tuple() and [str(s) for s in back[0][1].tuple_shapes()] == ["bf16[4,8]{1,0}", "s32[]"]
    assert isinstance(back[1], tuple) and back[1][0] == xc.HloSharding.iota_tile([2, 1])
    assert back[1][1].is_replicated()
    assert back[2:] == [b"140123", None]


def _fixture_module():
    """The fixture as the latest load_workload imported it (each load executes the file anew)."""
    import sys

    return sys.modules[f"jaxmem_model_{abs(hash(str((pathlib.Path(FIXTURES) / 'custom_partitioned.py').resolve())))}"]


def _program_text():
    _, built = _built(pathlib.Path(FIXTURES), "custom_partitioned.py", "dp", mesh="data=2",
                      model_args={"batch_size": 8})
    return compiled.lower(built)[0]


def test_the_cache_key_of_a_custom_partitioned_op_is_stable_across_lowerings():
    # from one call site, as the same command run twice (jax 0.9 numbers the location aliases by the
    # caller's columns, blanked in the key: two call sites on one line print them in another order)
    a, b = [_program_text() for _ in range(2)]
    assert a.as_text() != b.as_text()             # the op's callback key is a new id() each time
    ta, tb = cache.program_text(a), cache.program_text(b)
    assert ta == tb and "cp:" in ta


def test_the_cache_key_changes_with_the_partitioning_rule():
    lowered = _program_text()
    cp_model = _fixture_module()
    before = cache.program_text(lowered)
    original = cp_model._partition.__code__
    try:   # a rule that does something else: same lowered module, different partitioned program
        cp_model._partition.__code__ = (lambda mesh, arg_shapes, result_shape: (mesh, None, None, None)).__code__
        assert cache.program_text(lowered) != before
    finally:
        cp_model._partition.__code__ = original


@pytest.mark.parametrize("stopped", [True, False], ids=["compile-child", "in-process"])
def test_a_failing_partitioning_rule_is_the_users_error_naming_it(stopped):
    target, built = _built(pathlib.Path(FIXTURES), "custom_partitioned.py", "dp", mesh="data=2",
                           model_args={"batch_size": 8})
    cp_model = _fixture_module()
    original = cp_model._partition.__code__

    def broken(mesh, arg_shapes, result_shape):
        raise ValueError("this rule cannot split rows")

    try:
        cp_model._partition.__code__ = broken.__code__
        with pytest.raises(UserError, match=r"custom partitioning rule.*ValueError: this rule cannot split rows "
                                            r"\(at .*test_partitioners.py:\d+ in broken\)$"):
            compiled.compile_step(built, explain=True, cache=False,
                                  child=early_stop.Child.start(target) if stopped else None)
    finally:
        cp_model._partition.__code__ = original

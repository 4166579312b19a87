import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxmem.compiler import targets
from jaxmem.errors import UserError
from jaxmem.program.layouts import build_mesh, parse_mesh


def test_aliases_and_unknown():
    assert targets.resolve_gpu_name("A100") == "a100-80g"
    assert targets.resolve_gpu_name("h100-sxm") == "h100"
    with pytest.raises(UserError, match=r"unknown GPU 'v100'.*h100.*rtx-a6000"):
        targets.resolve_gpu_name("v100")


def test_default_is_h100_without_a_gpu():
    assert targets.resolve_gpu_name(None) == "h100"


@pytest.mark.parametrize("gpu", sorted(targets.CATALOGUE))
def test_every_catalogue_gpu_compiles_a_sharded_step(gpu):
    # docs/how-it-works.md §1: a field newer than jaxlib's proto breaks text parsing; compile each config we ship.
    target = targets.make_target(gpu, 8)
    assert target.deviceless and len(target.devices) == 8
    assert target.devices[0].device_kind == targets.CATALOGUE[gpu].description
    mesh = build_mesh(target.devices, parse_mesh("data=8"))
    w = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=NamedSharding(mesh, P(None, "data")))
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    c = jax.jit(jax.grad(lambda w, x: jnp.tanh(x @ w).sum())).lower(w, x).compile()
    assert c.memory_analysis().temp_size_in_bytes > 0


def test_multi_host_topology():
    assert targets.topology_string(32, None) == ("1x4x8", 4)
    assert targets.topology_string(256, None) == ("1x32x8", 32)
    assert targets.topology_string(4, None) == ("1x1x4", 1)
    with pytest.raises(UserError, match="does not divide"):
        targets.topology_string(12, 5)
    t = targets.make_target("h100", 32)
    assert t.hosts == 4 and len(t.devices) == 32


def test_cpu_target_needs_enough_host_devices():
    assert len(targets.make_target("cpu", 8).devices) == 8
    with pytest.raises(UserError, match="xla_force_host_platform_device_count=64"):
        targets.make_target("cpu", 64)


def test_local_without_gpu_says_so():
    with pytest.raises(UserError, match="no GPU is attached"):
        targets.make_target("local", 1)


def test_usable_fraction_follows_jax_env(monkeypatch):
    for var in ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.delenv(var, raising=False)
    assert targets.usable_fraction()[0] == 0.75
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".9")
    assert targets.usable_fraction()[0] == 0.9
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    assert targets.usable_fraction()[0] == 1.0

"""The mesh in context while the step is traced, as a trainer sets it (jaxmem.program.sharding.in_context),
and the activation constraints the model applied itself (sharding.model_constraints, the report's
`activation_constraints`)."""
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from click.testing import CliRunner
from jax.sharding import PartitionSpec as P

from jaxmem.cli import main
from jaxmem.program import sharding

TRAINERS = pathlib.Path(__file__).resolve().parent / "fixtures" / "trainers"


def _mesh():
    from jaxmem.compiler import targets
    from jaxmem.program import layouts

    spec = layouts.parse_mesh("fsdp=2")
    return layouts.build_mesh(targets.make_target("h100", 2).devices, spec)


def test_in_context_sets_the_mesh_every_way_a_trainer_does():
    import warnings

    with warnings.catch_warnings():   # the legacy name libraries still read
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.interpreters import pxla
        pxla.thread_resources  # noqa: B018
    mesh = _mesh()
    with sharding.in_context(mesh):
        # what tunix's shard() and eformer's get_incontext_mesh read, and jax.set_mesh's abstract mesh
        assert not pxla.thread_resources.env.physical_mesh.empty
        assert jax.sharding.get_abstract_mesh().axis_names == ("fsdp",)
        assert jax.devices()[0].platform == "gpu"   # the target's devices, as on the machine trained on
    assert pxla.thread_resources.env.physical_mesh.empty and jax.devices()[0].platform == "cpu"


def test_device_queries_answer_as_the_target_machine_and_make_it_only_when_asked():
    """What eformer's create_mesh and EasyDeL's config ask (default_backend, device_count(backend),
    devices(backend), local_devices) answer with the target's devices, made on the first question."""
    mesh = _mesh()
    asked = []

    def target():   # making it may ask jax which GPUs are attached (--gpu unset): jax's own answer then
        asked.append(jax.devices()[0].platform)
        return list(mesh.devices.flat)

    with sharding.device_queries(target):
        assert not asked
        assert jax.default_backend() == "gpu" and asked == ["cpu"]
        backend = jax.default_backend()
        assert jax.device_count(backend) == jax.local_device_count() == 2
        assert jax.devices(backend) == jax.local_devices() == list(mesh.devices.flat)
        assert jax.devices("cpu")[0].platform == "cpu"   # another backend asked by name: this process's own
        assert asked == ["cpu"]
    assert jax.default_backend() == "cpu" and jax.device_count() == len(jax.devices("cpu"))


def test_a_model_that_builds_its_own_mesh_as_easydel_does_analyzes_on_the_target():
    """EasyDeL's way (fixtures/trainers/own_mesh.py): the config made in workload() records
    jax.default_backend(), __init__ builds a mesh from jax.device_count/devices(backend), each call
    device_puts a table onto it. Before, that mesh held this process's CPU and the step failed
    ("incompatible devices"); now it is the target's, and the parameter bytes are exact."""
    r = CliRunner().invoke(main, ["analyze", str(TRAINERS / "own_mesh.py"), "--gpu", "h100", "--mesh", "dp=1,fsdp=4",
                                  "--json", "--no-explain"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    n = 128 * 64 + 64 * 128 + 128   # Embed(128, 64), Linear(64, 128) with its bias
    assert d["param_count"] == n
    assert d["breakdown"]["params"] == 4 * n // 4   # fp32, every leaf split over fsdp=4


def test_model_constraints_lists_the_models_own_calls_not_jaxmems():
    mesh = _mesh()

    def model(x):   # a bare PartitionSpec: resolved by the context mesh
        return jax.lax.with_sharding_constraint(x * 2, P("fsdp", None))

    with sharding.in_context(mesh):
        jaxpr = jax.make_jaxpr(model)(jax.ShapeDtypeStruct((4, 8), jnp.float32))
    got = sharding.model_constraints(jaxpr)
    assert got["count"] == 1 and got["sites"] == 1
    at = got["applied"][0]["at"]
    assert f"test_sharding.py:{model.__code__.co_firstlineno + 1} in " in at and at.endswith("model")
    assert "fsdp" in got["applied"][0]["spec"]
    assert np.all([a["count"] == 1 for a in got["applied"]])


def test_a_tunix_style_model_applies_its_activation_constraints_and_the_report_says_which():
    r = CliRunner().invoke(main, ["analyze", str(TRAINERS / "tunix_style.py"), "--gpu", "h100", "--mesh", "fsdp=4,tp=2",
                                  "--json", "--no-explain"])
    assert r.exit_code == 0, r.output
    ac = json.loads(r.output)["activation_constraints"]
    # two shard() calls per layer, two layers, each in the forward and the backward
    assert ac["count"] == 8 and ac["sites"] == 2
    assert {a["spec"] for a in ac["applied"]} == {"P('fsdp', None, 'tp')", "P('fsdp', None, None)"}
    assert all("tunix_style.py" in a["at"] for a in ac["applied"])

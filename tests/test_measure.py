"""jaxmem.truth.measure: the measuring process, its environment and its random arguments."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxmem.truth import measure
from jaxmem.errors import UserError


def test_case_round_trips_through_json():
    c = measure.Case(model_file="models/gpt2.py", model_args=(("preset", "tiny"), ("batch_size", 8)),
                     mesh="data=2,model=4", layout="tp",
                     precision="bf16", remat="full", backend="cpu")
    assert measure.Case.from_json(c.to_json()) == c
    assert c.n_devices == 8


def test_cpu_child_env_forces_the_mesh_device_count(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/x")
    env = measure.child_env(measure.Case(model_file="m.py", mesh="data=2"))
    flags = env["XLA_FLAGS"].split()
    assert "--xla_force_host_platform_device_count=2" in flags and "--xla_dump_to=/tmp/x" in flags
    assert not any(f.endswith("=8") for f in flags)
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(measure.MALLOC_MMAP_THRESHOLD)


def test_gpu_child_env_grows_the_pool_on_demand():
    env = measure.child_env(measure.Case(model_file="m.py", backend="gpu"))
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and "JAX_PLATFORMS" not in env


def test_random_args_match_every_abstract_argument(models_dir):
    case = measure.Case(model_file=str(models_dir / "gpt2.py"), model_args=(("preset", "tiny"),), mesh="data=2",
                        layout="fsdp")
    built = measure.build_case(case, jax.devices("cpu"))
    _, arrays = measure.random_args(built)
    abstract = jax.tree.leaves(built.args)
    assert len(arrays) == len(abstract)
    for a, sds, leaf in zip(arrays, abstract, built.leaves):
        assert a.shape == sds.shape and a.dtype == sds.dtype and a.sharding == sds.sharding
        if leaf.category == "batch":  # token ids: valid for any vocabulary
            assert set(np.unique(np.asarray(a))) <= {0, 1}
        if leaf.category == "optimizer_state" and "float" in leaf.dtype:
            assert np.asarray(a).min() >= 0  # Adam's second moment stays valid
    per_device = measure.per_device_bytes(arrays, list(built.mesh.devices.flat))
    assert per_device == [sum(leaf.device_bytes for leaf in built.leaves)] * 2  # what analyze counts per device


def test_random_args_handle_typed_rng_keys(models_dir):
    # NNX rng streams are typed keys (key<fry>), not numbers
    case = measure.Case(model_file=str(models_dir / "vit.py"), model_args=(("preset", "tiny"),), mesh="data=1",
                        layout="dp")
    built = measure.build_case(case, jax.devices("cpu"))
    _, arrays = measure.random_args(built)
    assert any(jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) for a in arrays)


def test_run_case_measures_what_xla_planned_in_a_fresh_process():
    # the calibration MLP at a size whose own buffers (~70 MB per device) dwarf the runtime's ~14 MB
    case = measure.Case(model_file="builtin:calibration", model_args=(("width", 2048), ("batch", 1024)),
                        mesh="data=2", layout="dp")
    r = measure.run_case(case)
    assert r["backend"] == "cpu" and r["n_devices"] == 2 and len(r["measured_peak_bytes"]) == 2
    # the argument bytes read from the placed shards are XLA's own argument bytes for the program
    assert r["args_bytes"] == [r["xla"]["argument"]] * 2
    # the measured peak holds every buffer XLA planned (its lower bound), and no more than the runtime's own
    # memory on top (per process ~14 MB here, docs/how-it-works.md section 6; 16 MiB per device allowed)
    for peak in r["measured_peak_bytes"]:
        assert r["xla"]["lower_bound"] <= peak <= r["xla"]["lower_bound"] + (16 << 20)
    # placing the arguments raised the RSS by their bytes (glibc returns freed blocks at once)
    assert abs(r["rss_args_delta"] - sum(r["args_bytes"])) < 8 << 20


def test_xla_defaults_measures_the_program_a_plain_jit_runs():
    # the same step, compiled without jaxmem's CPU option (YNNPACK fusions on): a different program
    case = measure.Case(model_file="builtin:calibration", mesh="data=1", layout="dp")
    built = measure.build_case(case, jax.devices("cpu")[:1])
    _, ours = measure._compile(built)
    _, default = measure._compile(built, xla_defaults=True)
    assert ours["argument"] == default["argument"]
    import jaxlib

    from jaxmem.compiler import versions

    if versions.parse(jaxlib.__version__) < (0, 10):   # jaxlib 0.9's XLA:CPU makes no YNNPACK fusions by default
        assert ours["temp"] == default["temp"]
    else:
        assert ours["temp"] != default["temp"]
    assert measure.Case.from_json(dataclasses.replace(case, xla_defaults=True).to_json()).xla_defaults


def test_run_case_reports_user_errors_as_such(tmp_path):
    with pytest.raises(UserError, match="model file not found"):
        measure.run_case(measure.Case(model_file=str(tmp_path / "missing.py")))

"""jaxmem.truth.measure: the measuring process, its environment and its random arguments."""

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
    per_device = measure._per_device_bytes(arrays, list(built.mesh.devices.flat))
    assert per_device == [sum(leaf.device_bytes for leaf in built.leaves)] * 2  # what analyze counts per device


def test_random_args_handle_typed_rng_keys(models_dir):
    # NNX rng streams are typed keys (key<fry>), not numbers
    case = measure.Case(model_file=str(models_dir / "vit.py"), model_args=(("preset", "tiny"),), mesh="data=1",
                        layout="dp")
    built = measure.build_case(case, jax.devices("cpu"))
    _, arrays = measure.random_args(built)
    assert any(jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) for a in arrays)


def test_run_case_measures_in_a_fresh_process():
    r = measure.run_case(measure.Case(model_file="builtin:calibration", mesh="data=2", layout="dp"))
    assert r["backend"] == "cpu" and r["n_devices"] == 2
    assert len(r["measured_peak_bytes"]) == 2 and len(r["args_bytes"]) == 2
    # per device = its arguments + an equal share of the step's RSS rise
    assert r["measured_peak_bytes"][0] == r["args_bytes"][0] + r["step_extra_bytes"] // 2
    assert r["xla"]["lower_bound"] > 0 and r["step_extra_bytes"] >= 0
    # the arguments' RSS rise is the arguments' bytes (glibc returns freed blocks at once)
    assert r["rss_args_delta"] < sum(r["args_bytes"]) + (8 << 20)


def test_run_case_reports_user_errors_as_such(tmp_path):
    with pytest.raises(UserError, match="model file not found"):
        measure.run_case(measure.Case(model_file=str(tmp_path / "missing.py")))

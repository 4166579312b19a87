"""Test set-up: 8 forced CPU devices and the deviceless-CUDA switch, before jax starts."""

import os
import pathlib

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

import pytest  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"


@pytest.fixture
def models_dir() -> pathlib.Path:
    return MODELS

"""Test set-up: 8 forced CPU devices and the deviceless-CUDA switch, before jax starts; a hermetic
environment (no user's compile cache or calibration file; every test's env changes undone)."""

import atexit
import os
import pathlib
import shutil
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
# The suite must not read a developer's own calibration (it changes the runtime terms) nor fill their
# compile cache; one cache for the session still spares compiling the same tiny step twice.
_SESSION = tempfile.mkdtemp(prefix="jaxmem-tests-")
atexit.register(shutil.rmtree, _SESSION, ignore_errors=True)
os.environ["JAXMEM_CACHE"] = os.path.join(_SESSION, "cache")
os.environ["JAXMEM_CALIBRATION"] = os.path.join(_SESSION, "calibration.json")
# Output width is what a test sets: pytest-xdist's workers inherit COLUMNS=80 (and a developer's
# shell may export it), which would cut the tables of a "piped" run.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

import pytest  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"


@pytest.fixture(autouse=True)
def _restore_environment():
    """Commands run in-process (click's CliRunner) may set allocator variables for their own process
    (e.g. verify's parent); undo them so a later test's verdict does not depend on test order."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def models_dir() -> pathlib.Path:
    return MODELS


def build_step(model, *, mesh: str = "data=1", gpu: str = "h100", model_args=None, **options):
    """(target, BuiltStep): the step `analyze` builds for the model file `model` with the
    AnalyzeOptions `options`, on `gpu`'s devices (deviceless for a catalogue GPU)."""
    from jaxmem.compiler import targets
    from jaxmem.pipeline import AnalyzeOptions
    from jaxmem.program import layouts, step
    from jaxmem.program.workload import load_workload

    o = AnalyzeOptions(mesh=mesh, gpu=gpu, **options)
    wl = load_workload(model, remat=o.remat, **(model_args or {}))
    ms = layouts.parse_mesh(o.mesh, o.axis_roles)
    target = targets.make_target(o.gpu, ms.size)
    return target, step.build(step.plan(wl, o.step_options(), ms), layouts.build_mesh(target.devices, ms))


def pytest_collection_modifyitems(config, items):
    """The `slow` marker on the tests tests/slow_tests.txt lists (measured: tests/slow_list.py),
    besides those marked in their file."""
    listed = pathlib.Path(__file__).with_name("slow_tests.txt")
    slow = set(listed.read_text().split()) if listed.exists() else set()
    import jax

    for item in items:
        if item.nodeid.split("[")[0] in slow:
            item.add_marker(pytest.mark.slow)
        held = item.get_closest_marker("holds_for")
        if held is not None and jax.__version__ not in held.args:
            item.add_marker(pytest.mark.skip(reason=f"its numbers are XLA's under jax {', '.join(held.args)}; "
                                                    f"this is jax {jax.__version__}"))

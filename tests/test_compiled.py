"""compile_step: the Artifacts of one compile, and the fast options that cannot change the answer."""
import json
import types

import numpy as np
import pytest

from conftest import build_step
from jaxmem.compiler import compiled, versions
from jaxmem.xla.hlo import decode_hlo_proto


def _built(models_dir, model: str, preset: str, layout: str, **args):
    return build_step(models_dir / model, mesh="data=8", layout=layout, model_args={"preset": preset, **args})[1]


XLA_NUMBERS = ("argument", "output", "alias", "temp", "generated_code", "peak", "host_temp")


# llama: layers under nn.scan (a while loop); gpt2: layers unrolled. dp and fsdp.
@pytest.mark.parametrize("model,preset,layout", [("llama.py", "tiny", "fsdp"), ("gpt2.py", "tiny", "dp"),
                                                 ("llama.py", "tiny", "dp")])
def test_fast_options_leave_the_buffer_assignment_identical(models_dir, model, preset, layout):
    built = _built(models_dir, model, preset, layout, batch_size=8)
    slow = compiled.compile_step(built, explain=True, cache=False, fast=False)
    fast = compiled.compile_step(built, explain=True, cache=False, fast=True)
    assert compiled.compile_options(built, fast=True).items() >= compiled.FAST_GPU_OPTIONS.items()
    assert {k: getattr(fast.stats, k) for k in XLA_NUMBERS} == {k: getattr(slow.stats, k) for k in XLA_NUMBERS}
    a, b = decode_hlo_proto(slow.dump), decode_hlo_proto(fast.dump)
    assert len(a.buffers) > 50
    assert a.buffers == b.buffers          # every logical buffer: size, shape, allocation, offset, live range
    assert list(a.timeline) == list(b.timeline)
    if model == "gpt2.py":
        # the dump options only add files: a compile without them has the same numbers (so a cached
        # compile with the explanation answers a request without it)
        plain = compiled.compile_step(built, explain=False, cache=False, fast=True)
        assert plain.dump is None
        same = XLA_NUMBERS
        if versions.gpu_peak_is_static():   # jaxlib 0.9: without the dump, XLA's peak is the static memory, said so
            same = tuple(k for k in XLA_NUMBERS if k != "peak")
            assert plain.stats.peak < fast.stats.peak and any("static memory alone" in n for n in plain.stats.notes)
        assert {k: getattr(plain.stats, k) for k in same} == {k: getattr(fast.stats, k) for k in same}
    # the Artifacts are plain JSON (the cache stores them so)
    assert fast.dump and "ENTRY" in fast.hlo_text and not fast.cached
    assert compiled.Artifacts.from_json(json.loads(json.dumps(fast.to_json()))) == fast


def test_a_fast_option_the_user_sets_in_xla_flags_is_theirs(monkeypatch):
    """A compile option overrides XLA_FLAGS: the fast options jaxmem adds leave out what the user set."""
    gpu_step = types.SimpleNamespace(mesh=types.SimpleNamespace(devices=np.array([types.SimpleNamespace(
        platform="cuda")])))
    name = next(iter(compiled.FAST_GPU_OPTIONS))
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert compiled.compile_options(gpu_step) == compiled.FAST_GPU_OPTIONS
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 --{name}=1")
    options = compiled.compile_options(gpu_step)
    assert name not in options and options == {k: v for k, v in compiled.FAST_GPU_OPTIONS.items() if k != name}
    assert compiled.compile_options(gpu_step, fast=False) == {}

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


@pytest.mark.parametrize("stopped", [False, True], ids=["whole", "stopped"])
def test_a_speed_option_xla_refuses_is_dropped_said_and_the_answer_unchanged(models_dir, monkeypatch, stopped):
    """A jaxlib whose XLA refuses a compile with one of jaxmem's speed options (jax 0.11.2 with the fusion
    autotuner off: "INTERNAL: No supported config found for HLO") is compiled again without them: the
    default pipeline's numbers, a compile_fallback note naming the options, none of them in compile_options.
    An option this XLA does not know is such a refusal on every jaxlib."""
    from jaxmem.compiler import early_stop

    target, built = build_step(models_dir / "gpt2.py", mesh="data=8", layout="dp",
                               model_args={"preset": "tiny", "batch_size": 8})
    plain = compiled.compile_step(built, explain=True, cache=False, fast=False)
    monkeypatch.setitem(compiled.FAST_GPU_OPTIONS, "xla_gpu_jaxmem_no_such_option", True)
    child = early_stop.Child.start(target) if stopped else None
    art = compiled.compile_step(built, explain=True, cache=False, fast=True, child=child)
    assert {k: getattr(art.stats, k) for k in XLA_NUMBERS} == {k: getattr(plain.stats, k) for k in XLA_NUMBERS}
    note = next(n for n in art.stats.notes if n.startswith("XLA refused the compile with jaxmem's speed option"))
    assert "xla_gpu_jaxmem_no_such_option=true" in note
    assert not any(o.split("=")[0] in compiled.FAST_GPU_OPTIONS for o in art.stats.compile_options)
    assert compiled.check_compile(art.stats)[0].kind == "compile_fallback"


def test_the_speed_options_compiled_with_are_in_the_report(models_dir):
    from jaxmem.pipeline import AnalyzeOptions, analyze_file

    r = analyze_file(str(models_dir / "mlp.py"), AnalyzeOptions(gpu="h100", mesh="data=8"))
    assert r.xla_flags["compile_options"] == list(compiled._named(compiled.fast_gpu_options()))
    assert ("xla_gpu_experimental_enable_fusion_autotuner=false" in r.xla_flags["compile_options"]) == \
        (versions.parse(versions.jaxlib.__version__)[:2] in versions.FUSION_AUTOTUNER_OFF_PROVEN)

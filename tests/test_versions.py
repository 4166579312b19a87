"""The installed JAX stack as jaxmem reads it (jaxmem/compiler/versions.py): the tested range, the
CUDA plugin's build versions in the target description, the versions and XLA flags a report names,
and the fallback when a jax lacks what the early-stopped compile needs."""
import json

import jax
import jaxlib
import pytest

from conftest import build_step
from jaxmem.compiler import compiled, early_stop, targets, versions


@pytest.mark.parametrize("text,parsed", [("0.12.0.1", (0, 12, 0, 1)), ("0.9.0", (0, 9, 0)), ("0.13.0rc1", (0, 13, 0)),
                                         ("0.10.2.dev20261201", (0, 10, 2))])
def test_versions_parse_to_their_numbers(text, parsed):
    assert versions.parse(text) == parsed


@pytest.mark.parametrize("version,tested", [("0.9.0", True), ("0.9.2", True), ("0.10.2", True), ("0.11.2", True),
                                            ("0.12.0.1", True), ("0.12.9", True), ("0.8.2", False),
                                            ("0.13.0", False), ("1.0.0", False)])
def test_the_tested_range_runs_from_0_9_0_through_every_0_12(version, tested):
    assert versions.in_tested_range(version) is tested


def test_cuda_and_cudnn_build_numbers_decode_as_their_libraries_encode_them():
    assert versions._cuda(13000) == (13, 0, 0) and versions._cuda(12090) == (12, 9, 0)
    assert versions._cudnn(91200) == (9, 12, 0) and versions._cudnn(90800) == (9, 8, 0)


def test_the_installed_jax_is_in_the_tested_range_and_warns_nothing():
    # CI runs this suite at both ends of the range: a leg outside it is a broken CI, not a warning
    assert versions.in_tested_range(jax.__version__) and versions.in_tested_range(jaxlib.__version__)
    assert versions.range_warning() is None


def test_a_jax_outside_the_range_gets_one_warning_naming_the_range(monkeypatch):
    monkeypatch.setattr(jax, "__version__", "0.13.1")
    message = versions.range_warning()
    assert message is not None and "jax 0.13.1" in message and versions.TESTED_TEXT in message
    assert "jaxlib" not in message.split(" is outside")[0]


def test_the_target_description_names_the_cuda_and_cudnn_the_plugin_was_built_with():
    built = versions.cuda_build()
    assert built is not None, "the suite runs with a CUDA plugin installed (.ci/run)"
    cuda, cudnn = built
    config = targets.CATALOGUE["h100"].target_config()
    assert f"runtime_version {{ major: {cuda[0]} minor: {cuda[1]} patch: {cuda[2]} }}" in config
    assert f"dnn_version_info {{ major: {cudnn[0]} minor: {cudnn[1]} }}" in config
    assert cuda[0] in (12, 13) and cudnn[0] >= 9


def test_installed_names_jax_jaxlib_flax_optax_and_the_plugin():
    v = versions.installed()
    assert v["jax"] == jax.__version__ and v["jaxlib"] == jaxlib.__version__
    assert {"python", "flax", "optax", "cuda_plugin", "cuda", "cudnn"} <= set(v)
    assert v["cuda_plugin"].split()[0] in versions.PLUGINS


def test_xla_flags_are_split_into_passed_and_dropped_with_the_reason():
    flags = versions.xla_flags("--xla_gpu_enable_triton_gemm=false --xla_force_host_platform_device_count=8 "
                               "--xla_dump_to=/tmp/x")
    assert flags["passed"] == ["--xla_gpu_enable_triton_gemm=false"]
    assert set(flags["dropped"]) == {"--xla_force_host_platform_device_count=8", "--xla_dump_to=/tmp/x"}
    assert all(flags["dropped"].values())


def test_the_summary_line_names_jax_the_plugin_cuda_and_the_flags():
    v = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "cuda_plugin": "jax-cuda13-plugin 0.12.0.1", "cuda": "13.0.0",
         "cudnn": "9.12.0", "flax": "0.12.12"}
    line = versions.summary(v, {"passed": ["--xla_a=1"], "dropped": {"--xla_dump_to=x": "why"}})
    assert line == ("jax 0.12.0.1 (jaxlib 0.12.0.1, jax-cuda13-plugin 0.12.0.1: CUDA 13.0.0, cuDNN 9.12.0), "
                    "flax 0.12.12; XLA_FLAGS: --xla_a=1 (1 left out of the compile: --json xla_flags)")
    assert versions.summary(v, {}).endswith("XLA_FLAGS: none")


def test_the_hlo_module_binding_reads_a_serialized_module():
    cls = versions.hlo_module_class()
    assert hasattr(cls, "from_serialized_hlo_module_proto")
    module = versions.hlo_module_from_text("HloModule m\n\nENTRY e {\n  ROOT p = f32[2] parameter(0)\n}\n")
    assert "HloModule m" in module.to_string()


def test_a_report_names_its_versions_and_flags_in_json_and_text(models_dir):
    from click.testing import CliRunner

    from jaxmem.cli import main

    args = ["analyze", str(models_dir / "mlp.py"), "--arg", "preset=tiny", "--gpu", "h100", "--mesh", "data=2"]
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["versions"] == versions.installed()
    assert d["xla_flags"]["passed"] == [] and "--xla_force_host_platform_device_count=8" in d["xla_flags"]["dropped"]
    text = CliRunner().invoke(main, args).output.strip().splitlines()[-1]
    assert f"jax {jax.__version__} (jaxlib {jaxlib.__version__}, {d['versions']['cuda_plugin']}" in text


def test_a_jax_without_the_early_stops_entry_compiles_whole_with_a_note(models_dir, monkeypatch):
    target, built = build_step(models_dir / "mlp.py", mesh="data=2", model_args={"preset": "tiny"})
    whole = compiled.compile_step(built, explain=True, cache=False)

    def missing(*_a, **_k):
        raise early_stop.Unsupported("jax 9.9 has no backend_compile_and_load (the early-stopped compile's entry)")

    monkeypatch.setattr(early_stop, "capture", missing)
    art = compiled.compile_step(built, explain=True, cache=False, child=early_stop.Child.start(target))
    assert art.stats.peak == whole.stats.peak and art.stats.temp == whole.stats.temp and art.dump is not None
    assert any("has no backend_compile_and_load" in n and "compiled whole" in n for n in art.stats.notes)

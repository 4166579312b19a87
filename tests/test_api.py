"""The Python API (jaxmem.analyze / compare / advise): the CLI's pipeline, options and messages from a
notebook; the Report's notebook rendering; a jax started before jaxmem named with the fix."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import ROOT
from helpers import MLP_MODEL as MLP  # noqa: E402

import jaxmem
from jaxmem import api, cli
from jaxmem.pipeline import AnalyzeOptions
from jaxmem.plan import compare as compare_mod
from jaxmem.program.workload import wrapped_linen_module
from jaxmem.report import BREAKDOWN_KEYS

TINY = {"preset": "tiny"}
CPU2 = {"gpu": "cpu", "mesh": "data=2"}   # tiny and fast: two of the 8 forced CPU devices (conftest)


def _module(path: str):
    spec = importlib.util.spec_from_file_location("mlp_for_test_api", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def mlp():
    return _module(MLP)


@pytest.fixture(scope="module")
def cpu_report():
    return jaxmem.analyze(MLP, args=TINY, **CPU2)


@pytest.fixture(scope="module")
def gpu_report():
    # a GPU target has a verdict (FITS) and usable memory; deviceless: no GPU needed
    return jaxmem.analyze(MLP, args=TINY, gpu="h100")


def _cli(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


def _plain(d):
    return json.loads(json.dumps(d))


def test_to_json_is_the_clis_json_for_the_same_options(cpu_report):
    res = _cli("analyze", MLP, "--arg", "preset=tiny", "--gpu", "cpu", "--mesh", "data=2", "--json")
    assert res.exit_code == 0, res.output
    cli_json = json.loads(res.stdout)
    assert _plain(cpu_report.to_json()) == cli_json   # every number, every field
    assert cli_json["per_device_peak_bytes"] == cpu_report.per_device_peak_bytes > 0


def test_a_workload_and_a_function_analyze_as_their_model_file_does(cpu_report, mlp):
    by_object = jaxmem.analyze(mlp.workload(preset="tiny"), **CPU2)
    by_function = jaxmem.analyze(mlp.workload, args=TINY, **CPU2)
    for r in (by_object, by_function):
        assert r.breakdown == cpu_report.breakdown and r.per_device_peak_bytes == cpu_report.per_device_peak_bytes
        assert r.model == "mlp-tiny"
    assert by_object.source == "<workload>" and by_function.source == "workload()"
    # a function is called as a model file's workload(): its arguments checked, remat passed to it
    with pytest.raises(jaxmem.UserError, match="workload\\(\\) expects preset to be str"):
        jaxmem.analyze(mlp.workload, args={"preset": 3}, **CPU2)
    # a Workload object cannot place checkpoints nor take arguments: said, not ignored
    with pytest.raises(jaxmem.UserError, match="remat='full'.*Workload object"):
        jaxmem.analyze(mlp.workload(preset="tiny"), remat="full", **CPU2)
    with pytest.raises(jaxmem.UserError, match="pass the function that builds it"):
        jaxmem.analyze(mlp.workload(preset="tiny"), args=TINY, **CPU2)


def test_a_librarys_model_object_wrapping_a_linen_module_is_refused_naming_its_module(mlp):
    # Hugging Face's FlaxPreTrainedModel keeps its linen module as `.module` (duck-typed: no transformers here)
    class FlaxTinyForCausalLM:
        def __init__(self, module):
            self.module = module

    wl = mlp.workload(preset="tiny")
    wrapper = FlaxTinyForCausalLM(wl.model)
    with pytest.raises(jaxmem.UserError) as e:
        jaxmem.analyze(dataclasses.replace(wl, model=wrapper), **CPU2)
    assert f"is a FlaxTinyForCausalLM, a library's wrapper around the Flax linen module {type(wl.model).__name__}" \
        in str(e.value) and "<the model>.module" in str(e.value)
    assert wrapped_linen_module(wrapper) is wl.model
    assert wrapped_linen_module(wl.model) is None   # a linen module is itself, never a wrapper


def test_an_unknown_option_is_named_with_the_closest_and_every_valid_one():
    with pytest.raises(jaxmem.UserError) as e:
        jaxmem.analyze(MLP, layuot="dp")
    msg = str(e.value)
    assert "unknown option 'layuot' (did you mean 'layout'?)" in msg
    valid = msg.split("Valid options: ")[1]
    # derived from AnalyzeOptions: every field is listed, under the CLI's name where it has another one
    for f in dataclasses.fields(AnalyzeOptions):
        name = {v: k for k, v in api.ALIASES.items()}.get(f.name, f.name)
        assert re.search(rf"\b{name}\b", valid), name
    with pytest.raises(jaxmem.UserError, match="did you mean 'layouts'"):
        jaxmem.compare(MLP, layots=["dp"])


@pytest.mark.parametrize("keyword, value, flag", [
    ("layout", "xx", "--layout"), ("batch", 0, "--batch"), ("batch", "8.5", "--batch"),
    ("mem_fraction", 2, "--mem-fraction"), ("precision", "fp4", "--precision"), ("lora", -1, "--lora"),
    ("depth", 0, "--depth"), ("lora_alpha", float("nan"), "--lora-alpha")])
def test_a_bad_value_gets_the_clis_message(keyword, value, flag):
    res = _cli("analyze", MLP, flag, value)
    assert res.exit_code == 2
    cli_message = re.search(rf"Invalid value for '{flag}': (.*)", res.stderr).group(1).strip()
    with pytest.raises(jaxmem.UserError) as e:
        jaxmem.analyze(MLP, **{keyword: value})
    assert str(e.value) == f"{keyword}={value!r}: {cli_message}"


def test_a_bad_grid_value_gets_the_clis_message_before_any_compile():
    for keyword, value, flag in (("loras", [0, -4], "--loras"), ("base_dtypes", ["fp8"], "--base-dtypes")):
        res = _cli("compare", MLP, flag, ",".join(map(str, value)))
        assert res.exit_code == 2 and f"Invalid value for '{flag}'" in res.stderr
        with pytest.raises(jaxmem.UserError, match=keyword):
            jaxmem.compare(MLP, **{keyword: value})


def test_a_value_the_pipeline_refuses_is_its_error_word_for_word():
    res = _cli("analyze", MLP, "--arg", "preset=tiny", "--gpu", "h1000")
    assert res.exit_code == 2
    with pytest.raises(jaxmem.UserError) as e:
        jaxmem.analyze(MLP, args=TINY, gpu="h1000")
    assert res.stderr.strip() == f"error: {e.value}"
    with pytest.raises(jaxmem.UserError, match="donate=1: expected True or False"):
        jaxmem.analyze(MLP, donate=1)


def test_repr_html_shows_the_verdict_the_breakdown_and_the_curve(gpu_report):
    page = gpu_report._repr_html_()
    assert '<span id="verdict" class="badge ok">FITS</span>' in page
    assert set(gpu_report.breakdown) <= set(BREAKDOWN_KEYS)
    for key in gpu_report.breakdown:   # fp8_state only under --precision fp8
        assert f">{key}</td>" in page, key
    svg = re.search(r"<svg .*?</svg>", page, re.S).group(0)
    assert svg.count("<polyline") == 1 and "peak " in svg
    for what in (gpu_report.model, gpu_report.target.description, "usable", "headroom"):
        assert what in page
    assert "<script" not in page   # a notebook's output may not run one, and needs none
    # every rule is scoped to the output's own element: the notebook around it keeps its style
    uid = re.match(r'<div id="(jaxmem-[0-9a-f]+)"', page).group(1)
    css = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    for rule in re.findall(r"([^{}]+)\{[^{}]*\}", css):
        for sel in rule.split(","):
            assert sel.strip().startswith(f"#{uid}"), sel
    # a second report: its own ids, so its curve's clip path is its own
    worse = dataclasses.replace(gpu_report, fits=False, headroom_bytes=-1, model="other")
    other = worse._repr_html_()
    assert "DOES NOT FIT" in other and re.match(r'<div id="(jaxmem-[0-9a-f]+)"', other).group(1) != uid


def test_compare_returns_a_row_per_layout(cpu_report, mlp):
    rows = jaxmem.compare(MLP, args=TINY, layouts=["dp", "fsdp"], jobs=1, **CPU2)
    assert [c.choice for c in rows] == [{"layout": "dp"}, {"layout": "fsdp"}]
    assert all(c.status == "ok" and c.report is not None for c in rows)
    assert rows[1].report.per_device_peak_bytes == cpu_report.per_device_peak_bytes   # fsdp is the default
    assert rows.to_json() == compare_mod.to_json(list(rows)) and rows[0].to_json() == rows.to_json()[0]
    table = rows._repr_html_()
    assert table.count("<tr>") == 3 and ">dp</td>" in table and ">fsdp</td>" in table
    # a function's rows compile in this process: the same rows
    again = jaxmem.compare(mlp.workload, args=TINY, layouts=["dp", "fsdp"], **CPU2)
    assert [c.report.breakdown for c in again] == [c.report.breakdown for c in rows]
    # a bad grid value: the CLI's message, before any compile
    with pytest.raises(jaxmem.UserError, match="'xx' in 'dp,xx': unknown layout"):
        jaxmem.compare(MLP, layouts=["dp", "xx"])


def test_every_grid_axis_of_compare_has_its_keyword():
    assert set(api.GRID.values()) == set(compare_mod.AXES)


def test_advise_returns_its_ranked_plans(mlp):
    advice = jaxmem.advise(mlp.workload, args=TINY, gpu="a100-80g", all=True, changes=["precision"])  # no fp8
    assert advice.searched and advice.original.report is not None
    (plan,) = advice.candidates
    assert plan.changes == (("precision", "bf16"),) and plan.fits and plan.report.options["precision"] == "bf16"
    d = advice.to_json()
    assert d["schema"] == "jaxmem.advise/2" and d["candidates"][0]["per_device_peak_bytes"] == plan.peak
    assert d["candidates"][0]["command"].startswith("jaxmem analyze 'workload()' ")
    html = advice._repr_html_()
    assert "FITS" in html
    # the lists `jaxmem advise` prints, titled alike: the step as given, then the plans that fit on its GPU
    assert "<h3>the step as given</h3>" in html and "<h3>plans that fit on the 1 GPU as given" in html
    assert "more GPUs" not in html and "do not fit" not in html   # no such plans: no such list


def _loop_workload():
    """A linen model written as outside code is: blocks called in a Python loop, layers with their own
    dtype/param_dtype, no remat argument (a remat row must find the repeated block itself)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(64, dtype=jnp.bfloat16, param_dtype=jnp.float32)(x)
            return x + nn.Dense(32, dtype=jnp.bfloat16, param_dtype=jnp.float32)(nn.gelu(h))

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(3):
                x = Block()(x)
            return x.astype(jnp.float32).mean()

    return jaxmem.Workload(model=Net(), batch={"x": jax.ShapeDtypeStruct((8, 32), jnp.bfloat16)},
                           loss=lambda m, b: m(b["x"]))


def test_compare_of_a_function_checkpoints_its_repeated_block_as_a_files_rows_do():
    rows = jaxmem.compare(_loop_workload, gpu="h100", remats=["none", "full"], jobs=1)
    assert [c.status for c in rows] == ["ok", "ok"], [c.error for c in rows]
    assert rows[0].report.options.get("remat_at") is None
    assert rows[1].report.options["remat_at"] == "^Block$"   # found by tracing the function's step


def test_advise_of_a_function_tries_remat_at_its_repeated_block():
    advice = jaxmem.advise(_loop_workload, gpu="h100", all=True, changes=["remat"], jobs=1)
    assert advice.candidates and all(c.options.remat_at == "^Block$" for c in advice.candidates)


def test_a_fit_search_takes_a_workload_as_the_cli_takes_a_file():
    (row,) = jaxmem.compare(_loop_workload(), gpu="h100", find_batch=True, jobs=1)
    assert row.status == "ok" and row.max_batch is not None and row.max_batch >= 8


@pytest.mark.parametrize("kw, message", [
    ({"find_batch": True, "find_devices": True}, "one search at a time"),
    ({"margin": 0.1}, "margin= applies to a fit search"),
    ({"find_batch": True, "granule": 128}, "granule= is the step of find_seq"),
    ({"find_seq": "seq len"}, "expected the name of the workload argument"),
    ({"find_batch": "yes"}, "expected True or False"),
])
def test_fit_search_keywords_are_checked_before_any_compile(kw, message):
    with pytest.raises(jaxmem.UserError, match=message):
        jaxmem.compare(MLP, args=TINY, **kw)


# One script for both start-up cases: jax initialised before `import jaxmem` (so without the deviceless
# switch), and its CPU backend started with one device. CUDA_VISIBLE_DEVICES='' makes the CUDA plugin
# refuse to load without the switch on a machine with a GPU too.
_STARTED_FIRST = """
import jax
jax.devices()
import jaxmem
for kw in ({"gpu": "h100"}, {"gpu": "cpu", "mesh": "data=2"}):
    try:
        jaxmem.analyze(MODEL, args={"preset": "tiny"}, **kw)
        print("NO ERROR")
    except jaxmem.UserError as e:
        print("ERROR:", e)
print("API", jaxmem.analyze.__module__)
"""


def test_jax_started_before_jaxmem_is_a_user_error_that_says_what_to_do():
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "XLA_FLAGS")}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", f"MODEL = {MLP!r}\n" + _STARTED_FIRST], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    gpu, cpu, api_line = [ln for ln in out.stdout.splitlines() if ln.startswith(("ERROR", "NO ERROR", "API"))]
    assert gpu.startswith("ERROR: cannot build a deviceless h100 topology: jax's backend was initialised before "
                          "jaxmem was imported")
    assert "import jaxmem` before touching jax" in gpu and "JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1" in gpu
    assert "pip install" not in gpu   # the plugin is installed: not an install problem
    assert cpu.startswith("ERROR: the mesh needs 2 CPU devices but jax has 1")
    assert "--xla_force_host_platform_device_count=2" in cpu and "restart the kernel" in cpu
    assert api_line == "API jaxmem.api"


def _wakeup_fd() -> int:
    import signal

    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def test_a_signal_mid_compile_never_ends_the_callers_process():
    """The CLI's scope wakes its helper on a signal, which ends a process stuck in a compile; the API's
    (a notebook's kernel) does not: the interrupt waits for the compile instead."""
    from jaxmem import scratch

    with scratch.run_scope():
        assert _wakeup_fd() >= 0
    with api._session() as cpu_devices:
        cpu_devices(0)
        assert _wakeup_fd() == -1


# -- issue 25: ^C during an API call is the caller's KeyboardInterrupt --------------------------------

_SIGINT_CALLER = r'''
import gc, os, signal, sys, time
import jaxmem
from jaxmem import api

def interrupt_in_gc():
    """SIGINT handled inside a garbage-collection callback, where Python ignores exceptions (jax's
    _xla_gc_callback): before the fix, during the option checks, outside jaxmem's scope."""
    def cb(phase, info):
        if phase == "start":
            gc.callbacks.remove(cb)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
    gc.callbacks.append(cb)
    gc.collect()

def swallowed_then_made_up_error():
    """jax's bare except around a plugin's initialize swallows the interrupt; what fails next is no
    diagnosis of the user's (the 'cannot build a deviceless topology' of the issue)."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    except BaseException:
        pass
    raise jaxmem.UserError("cannot build a deviceless h100 topology (made up by the interrupt)")

mode = sys.argv[1]
if mode == "gc":
    real = api._options
    def options(*a, **k):
        interrupt_in_gc()
        return real(*a, **k)
    api._options = options
    model = "tests/fixtures/mlp_small.py"
else:
    def model():
        swallowed_then_made_up_error()
try:
    r = jaxmem.analyze(model, gpu="cpu", cache=False, explain=False)
    print("REPORT")
except KeyboardInterrupt as e:
    print("KeyboardInterrupt")
except jaxmem.UserError as e:
    print("UserError", e)
'''


@pytest.mark.parametrize("mode", ["gc", "swallowed"])
def test_an_interrupt_during_an_api_call_is_a_keyboard_interrupt(mode):
    # started as from a terminal: SIGINT at its default (pytest-xdist's workers ignore it, and a Python started
    # with SIGINT ignored keeps it ignored, jaxmem too: no interrupt to test then)
    r = subprocess.run([sys.executable, "-c", _SIGINT_CALLER, mode], capture_output=True, text=True, cwd=ROOT,
                       timeout=300, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.stdout.strip() == "KeyboardInterrupt", (r.stdout, r.stderr[-2000:])
    assert "Exception ignored" not in r.stderr


def test_the_types_the_api_returns_are_exported_and_load_lazily():
    from jaxmem.plan.advise import Advice
    from jaxmem.plan.compare import Rows
    from jaxmem.program.options import AnalyzeOptions

    assert (jaxmem.Advice, jaxmem.Rows, jaxmem.AnalyzeOptions) == (Advice, Rows, AnalyzeOptions)
    assert set(jaxmem.__all__) >= {"Advice", "Rows", "AnalyzeOptions", "Report", "ReportWarning"}
    # `import jaxmem` alone loads no jax: the lazy names are what keep it so
    code = "import sys, jaxmem; print('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_api_checks_its_keywords_without_the_cli_or_click():
    code = ("import sys, jaxmem\n"
            "try:\n    jaxmem.analyze('models/mlp.py', layout='fsdpp', gpu='h100')\n"
            "except jaxmem.UserError as e:\n    print(e)\n"
            "print('click' in sys.modules, 'jaxmem.cli' in sys.modules, 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout.splitlines()
    assert out == ["layout='fsdpp': 'fsdpp' is not one of 'dp', 'fsdp', 'tp', 'fsdp_tp'. (did you mean fsdp?)",
                   "False False False"], out


@pytest.mark.parametrize("value", ["fsdpp", "x", 3, "DP", "fsdp"])
def test_a_choice_is_refused_in_the_words_the_cli_uses(value):
    import click

    from jaxmem.cli_params import Choice
    from jaxmem.program import values
    from jaxmem.program.options import LAYOUTS

    def outcome(convert):
        try:
            return convert()
        except (click.BadParameter, values.BadValue) as e:
            return e.message

    assert outcome(lambda: values.choice(value, LAYOUTS)) == outcome(lambda: Choice(LAYOUTS).convert(value, None, None))
    for choices in (("local", "ray"), ("optimizer",)):   # click's own Choice: no closest-choice hint
        assert (outcome(lambda c=choices: values.choice(value, c, hint=False))
                == outcome(lambda c=choices: click.Choice(c).convert(value, None, None)))


@pytest.mark.parametrize("value", [0, -1, "x", "3", 2.5, 7])   # True: click reads 1; the API refuses it (below)
def test_a_count_is_refused_in_the_words_the_cli_uses(value):
    import click

    from jaxmem.program import values

    def outcome(convert):
        try:
            return convert()
        except (click.BadParameter, values.BadValue) as e:
            return e.message

    for minimum in (0, 1):
        assert (outcome(lambda m=minimum: values.count(value, m))
                == outcome(lambda m=minimum: click.IntRange(min=m).convert(value, None, None)))


@pytest.mark.parametrize("keyword, value, message", [
    ("lora", True, "lora=True: True is not a number; give a whole number of at least 0"),
    ("mem_fraction", True, "mem_fraction=True: True is not a number; give a share of the card in (0, 1], e.g. 0.9"),
    ("batch", True, "batch=True: True is not a number; give the global batch in digits"),
    ("hosts", False, "hosts=False: False is not a number; give a whole number of at least 1"),
    ("lora_alpha", True, "lora_alpha=True: True is not a number; give a positive number"),
    ("top", np.bool_(True), "top=np.True_: True is not a number"),
])
def test_a_bool_is_no_number_to_any_option(keyword, value, message):
    # issue 47: lora=True analyzed rank 1 and mem_fraction=True became 1.0, while batch=True was refused
    with pytest.raises(jaxmem.UserError) as e:
        jaxmem.analyze(MLP, gpu="h100", **{keyword: value})
    assert str(e.value).startswith(message.replace("np.True_: True", f"{value!r}: {value!r}"))


def test_a_bool_is_no_number_to_compares_and_advises_own_keywords():
    with pytest.raises(jaxmem.UserError, match=r"margin=True: True is not a number"):
        jaxmem.compare(MLP, gpu="h100", find_batch=True, margin=True)
    with pytest.raises(jaxmem.UserError, match=r"jobs=True: True is not a number"):
        jaxmem.advise(MLP, gpu="h100", jobs=True)


def test_numpy_integers_are_integers_to_options_and_workload_arguments(monkeypatch):
    # issue 47: np.int64(128) was "not a number" to a config.json's batch_size (jaxmem.hf takes ints)
    from types import SimpleNamespace

    seen = {}
    monkeypatch.setattr(api, "_jax_side", lambda: SimpleNamespace(pipeline=SimpleNamespace(
        analyze_model=lambda model, opts: seen.setdefault("opts", opts))))
    jaxmem.analyze(MLP, args={"batch_size": np.int64(128), "scale": np.float32(0.5), "flag": np.bool_(True)},
                   gpu="h100", batch=np.int64(64), top=np.int64(2), hosts=np.int64(1))
    opts = seen["opts"]
    assert dict(opts.model_args) == {"batch_size": 128, "scale": 0.5, "flag": np.bool_(True)}
    assert [type(v) for _, v in opts.model_args] == [int, float, np.bool_]   # a numpy bool stays no number
    assert (opts.batch, opts.top, opts.hosts) == (64, 2, 1)

"""Every analyze option is applied or refused on every path (issue 51 point 3, issue 54 point 5): for each
option x each entry -- a linen model file, an NNX model file, a config.json, a Workload(step=...), an Equinox
model through jaxmem.equinox_workload -- the step is planned, built and lowered (no compile), and either
jaxmem refuses it (a UserError: exit 2, naming the option) or the report's `options` say it and the lowered
program shows it. A custom step's own errors: a new state that differs from its input, --remat-at that
finds nothing, --remat without a hook; an error in the model's code after jaxmem changed it names the change."""

from __future__ import annotations

import pathlib
import re

import pytest

import jaxmem
from jaxmem import api
from jaxmem.analysis import fields, stages
from jaxmem.compiler import compiled as compiled_mod
from jaxmem.errors import UserError
from jaxmem.program.workload import load_workload, running_user_code

pytest.importorskip("equinox")

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"

# entry -> (model file, --arg pairs, the --remat-at regex that names one of its blocks)
ENTRIES = {
    "linen": (FIX / "finetune_mlp.py", {}, "^a$"),
    "nnx": (FIX / "finetune_nnx.py", {}, "Linear"),
    "config": (FIX / "hf" / "llama", {"seq_len": 16, "batch_size": 4}, None),   # takes --remat itself
    "custom": (FIX / "custom_step_linen.py", {}, "Block"),
    "equinox": (FIX / "eqx_gpt.py", {}, "Block"),
}
CUSTOM = ("custom", "equinox")   # the step is the user's: jaxmem changes nothing inside it but --remat-at

# option -> (keywords, the entries that must refuse it)
OPTIONS = {
    "precision=bf16": ({"precision": "bf16"}, CUSTOM),
    "precision=bf16-pure": ({"precision": "bf16-pure"}, CUSTOM),
    "precision=fp8": ({"precision": "fp8"}, CUSTOM),
    "optimizer=sgd": ({"optimizer": "sgd"}, CUSTOM),
    "moment_dtype=bf16": ({"moment_dtype": "bf16", "optimizer": "adamw"}, CUSTOM),
    "batch=16": ({"batch": 16}, ()),
    "accum=2": ({"accum": 2}, CUSTOM),
    "remat=full": ({"remat": "full"}, ("linen", "nnx", *CUSTOM)),   # no hook and no --remat-at: refused
    "remat=full+remat_at": ({"remat": "full", "remat_at": "@"}, ()),
    "remat_at=nothing": ({"remat": "full", "remat_at": "NoSuchModule"}, ("linen", "nnx", "config", *CUSTOM)),
    "layout=dp": ({"layout": "dp", "mesh": "data=2"}, ()),
    "mesh=data=2": ({"mesh": "data=2"}, ()),
    "no-donate": ({"donate": False}, ()),
    "freeze": ({"freeze": "head|lm_head"}, CUSTOM),
    "train_all": ({"train_all": True}, CUSTOM),
    "lora=4": ({"lora": 4, "precision": "bf16"}, CUSTOM),
    "lora+targets+alpha": ({"lora": 4, "lora_targets": ".", "lora_alpha": 8.0}, CUSTOM),
    "lora+base=int8": ({"lora": 4, "base_dtype": "int8", "precision": "bf16"}, CUSTOM),
    "base_dtype without lora": ({"base_dtype": "int8"}, tuple(ENTRIES)),
    "offload=optimizer": ({"offload": "optimizer"}, CUSTOM),
    "axis_types=explicit": ({"axis_types": "explicit"}, None),   # None: applied, or refused by the model's code
}


def _built(entry: str, kw: dict):
    """The step planned, built and lowered for `kw` (no compile): (options as the report states them, the
    lowered program's text, the built step, the workload). A refusal raises UserError."""
    path, args, block = ENTRIES[entry]
    kw = dict(kw)
    if kw.get("remat_at") == "@":
        if block is None:
            kw.pop("remat_at")
        else:
            kw["remat_at"] = block
    opts = api._options({"gpu": "h100", "args": args, **kw})
    wl = load_workload(path, remat=opts.remat, remat_at=opts.remat_at, **dict(opts.model_args))
    with running_user_code(path):
        prepared = stages.prepare(wl.checked(str(path)), opts, str(path), 0.0)
        traced = stages.trace(prepared, prestart=False)
        try:
            lowered, _ = compiled_mod.lower(traced.built)
        finally:
            if traced.child is not None:
                traced.child.close()
    text = lowered.as_text()
    if opts.remat != "none":   # a checkpoint shows in the traced program (a scan's has no CSE barrier)
        import jax

        built = traced.built
        with built.trace_context():
            text += str(jax.jit(built.fn).trace(*built.args).jaxpr)
    return fields.options(prepared.opts, prepared.wl, traced.built, prepared.planned), text, traced.built, \
        prepared.wl


def _shows(name: str, kw: dict, options: dict, text: str, built, wl) -> None:
    """The lowered program (and the step's leaves) show what `options` claim."""
    leaves = built.leaves
    if "precision" in kw and not wl.is_custom_step:
        assert options["precision"] == kw["precision"]
        assert ("f8E4M3" in text) == (kw["precision"] == "fp8")
        assert "bf16" in text
    if kw.get("optimizer"):
        assert options["optimizer"] == kw["optimizer"]
    if kw.get("moment_dtype"):
        assert options["moment_dtype"] == "bf16"
        assert any(x.category == "optimizer_state" and x.dtype == "bfloat16" for x in leaves)
    if kw.get("batch"):
        assert options["batch"] == kw["batch"]
        assert all(x.shape[0] == kw["batch"] for x in leaves if x.category == "batch")
    if kw.get("accum"):
        assert options["accum"] == 2 and "stablehlo.while" in text
    if kw.get("remat") == "full":
        assert options["remat"] == "full"
        if "remat_at" in kw and "remat_placed" in options:
            assert options["remat_placed"]
        # the traced program holds a checkpoint: jax.checkpoint's primitive (remat2; checkpoint in some versions)
        assert re.search(r"\b(remat2|checkpoint)\[", text)
    if kw.get("donate") is False:
        assert options["donate"] is False and built.donate_argnums == ()
    if "mesh" in kw:
        assert built.mesh.devices.size == 2
    if kw.get("layout") == "dp":
        assert all(not any(x.spec) for x in leaves if x.category == "params")
    if kw.get("freeze"):
        assert options["freeze"] == kw["freeze"]
        assert any(x.trainable is False for x in leaves) and any(x.trainable for x in leaves)
    if kw.get("train_all"):
        assert options["train_all"] is True and all(x.trainable for x in leaves if x.category == "params")
    if kw.get("lora"):
        assert options["lora_rank"] == 4 and any("_lora_a" in x.path for x in leaves)
        if kw.get("lora_alpha"):
            assert (options["lora_targets"], options["lora_alpha"]) == (".", 8.0)
    if kw.get("base_dtype"):
        assert options["base_dtype"] == "int8" and any(x.dtype == "int8" for x in leaves)
    if kw.get("offload"):
        assert options["offload"] == "optimizer"
        assert all(x.memory_kind == "pinned_host" for x in leaves if x.category == "optimizer_state")
    if kw.get("axis_types"):
        assert options.get("axis_types") == "explicit"


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_option_is_applied_or_refused_on_every_path(name, entry):
    kw, refused = OPTIONS[name]
    if refused is not None and entry in refused:
        with pytest.raises(UserError):
            _built(entry, kw)
        return
    try:
        options, text, built, wl = _built(entry, kw)
    except UserError:
        if refused is None:   # the model's own code decides (explicit sharding): refused, never misreported
            return
        raise
    _shows(name, kw, options, text, built, wl)


def test_a_custom_step_whose_new_state_differs_is_refused_naming_the_leaf():
    import jax
    import jax.numpy as jnp

    state = {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32), "b": jax.ShapeDtypeStruct((8,), jnp.float32)}
    batch = {"x": jax.ShapeDtypeStruct((4, 8), jnp.float32)}
    lies = {
        "dtype": (lambda s, b: ({**s, "w": s["w"].astype(jnp.bfloat16)}, None),
                  r"state\['w'\] is float32\[8, 8\] in the input and bfloat16\[8, 8\] in the new state"),
        "shape": (lambda s, b: ({**s, "b": s["b"][:4]}, None), r"state\['b'\] is float32\[8\] in the input"),
        "structure": (lambda s, b: ({"w": s["w"]}, None), r"state\['b'\] is only in the input"),
    }
    for step, match in lies.values():
        wl = jaxmem.Workload(step=step, state=state, batch=batch)
        with pytest.raises(UserError, match=match):
            jaxmem.analyze(wl, gpu="h100")
    ok = jaxmem.Workload(step=lambda s, b: (jax.tree.map(lambda x: x * 2, s), None), state=state, batch=batch)
    assert jaxmem.analyze(ok, gpu="h100").options["remat"] == "none"


def test_remat_at_applies_to_the_linen_modules_a_custom_step_calls():
    r = jaxmem.analyze(FIX / "custom_step_linen.py", gpu="h100", remat="full", remat_at="Block")
    assert (r.options["remat_at"], r.options["remat_placed"]) == ("Block", ["block_0", "block_1"])
    with pytest.raises(UserError, match=r"finds no module in the step.*none was called.*jax.checkpoint"):
        jaxmem.analyze(FIX / "custom_step.py", gpu="h100", remat="full", remat_at="Block")   # plain JAX
    with pytest.raises(UserError, match=r"finds no module in the step.*Block \(block_0\)"):
        jaxmem.analyze(FIX / "custom_step_linen.py", gpu="h100", remat="full", remat_at="Nope")
    with pytest.raises(UserError, match=r"its own `step`.*workload\(remat='none'\).*jaxmem.remat_policy"):
        jaxmem.analyze(FIX / "custom_step_linen.py", gpu="h100", remat="full")


def test_an_error_in_the_models_code_after_the_precision_cast_names_the_flag():
    with pytest.raises(UserError, match=r"carry.*jaxmem changed the model's program before this error: --precision "
                                        r"bf16 cast.*--precision fp32 runs the model as written"):
        jaxmem.analyze(FIX / "scan_carry_fp32.py", gpu="h100", precision="bf16")
    assert jaxmem.analyze(FIX / "scan_carry_fp32.py", gpu="h100").options["precision"] == "fp32"   # as written

"""benchmarks/published.py: its recipe data is well formed and its table renders (no real compiles)."""
import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pub():
    spec = importlib.util.spec_from_file_location("published", ROOT / "benchmarks" / "published.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["published"] = mod   # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_every_recipe_is_well_formed(pub):
    from jaxmem.compiler import targets
    from jaxmem.program.workload import REMAT_POLICIES

    assert len(pub.RECIPES) >= 8
    assert len({r.key for r in pub.RECIPES}) == len(pub.RECIPES)
    for r in pub.RECIPES:
        assert r.source and r.revision and r.gpu_published and r.documented and r.title, r.key
        assert r.gpu in targets.CATALOGUE and r.gpus >= 1, r.key
        assert r.outcome in ("ran", "oom"), r.key
        assert 0 < r.mem_fraction <= 1 and r.mem_fraction_source, r.key
        assert r.attention in ("xla", "cudnn"), r.key
        # cuDNN's fused attention has no fp32 kernel: a flash row computes in bf16 (models/llama.py refuses otherwise)
        if r.attention == "cudnn":
            assert r.model_takes_attention, r.key
            assert r.precision in ("bf16", "bf16-pure") or ("numerics", "maxtext") in r.args, r.key
        assert r.published and all(isinstance(v, str) and v for v in r.published.values()), r.key
        # a documented run has a step time to compare with, and says where it comes from
        assert (r.step_s is not None) == (r.outcome == "ran") and (r.step_s is None or r.step_how), r.key
        assert (ROOT / r.model).is_file() and r.remat in REMAT_POLICIES, r.key
        assert r.approximations, r.key
        # the mesh holds the devices the batch is split over
        size = 1
        for part in r.mesh.split(","):
            size *= int(part.split("=")[1])
        assert size <= r.gpus and r.batch % size == 0, r.key
    assert {r.outcome for r in pub.RECIPES} == {"ran", "oom"}


def test_flags_that_only_write_files_and_unknown_ones_are_not_passed(pub):
    kept, dropped = pub.applicable_flags(
        "--xla_dump_to=/x --xla_gpu_enable_command_buffer='' --xla_gone=true --xla_disable_hlo_passes=rematerialization "
        "--xla_gpu_pgle_profile_file_or_directory_path=/p.pbtxt", known=lambda fs: [f for f in fs if "gone" in f])
    assert kept == ["--xla_gpu_enable_command_buffer=", "--xla_disable_hlo_passes=rematerialization"]
    assert [f for f, _ in dropped] == ["--xla_dump_to=/x", "--xla_gpu_pgle_profile_file_or_directory_path=/p.pbtxt",
                                       "--xla_gone=true"]


def test_the_command_carries_the_recipe(pub):
    r = next(r for r in pub.RECIPES if r.key.startswith("dgxc-maxtext-llama3-70b-128"))
    argv = pub.analyze_argv(r, "cudnn")
    assert argv[:2] == ["analyze", "models/llama.py"] and "--json" in argv
    assert argv[argv.index("--mem-fraction") + 1] == "0.94" and "attention=cudnn" in argv
    line = pub.command_line(argv, ["--xla_disable_hlo_passes=rematerialization"])
    assert line.startswith("XLA_FLAGS=--xla_disable_hlo_passes=rematerialization jaxmem analyze models/llama.py")


def _run(fits, peak, step):
    return {"exit": 0 if fits else 3, "seconds": 1.0, "fits": fits, "peak": peak, "usable": 60 * 2**30,
            "headroom": 60 * 2**30 - peak, "usable_note": "--mem-fraction 0.9", "breakdown": {}, "xla": {},
            "param_count": 1, "warnings": [{"kind": "gradients_not_split", "message": ""}],
            "step_time": {"available": True, "estimate_s": step, "compute_s": step, "memory_s": 0.1,
                          "communication_s": 0.0, "flops": 500e12, "peak_flops": 1000e12}}


def test_the_renderer_on_a_tiny_fake_result(pub):
    ran, oom = pub.RECIPES[0], next(r for r in pub.RECIPES if r.outcome == "oom")
    import dataclasses

    results = [
        {"recipe": dataclasses.asdict(ran), "attention_run": "cudnn", "flags_applied": ["--xla_a=1"],
         "flags_dropped": [{"flag": "--xla_dump_to=/x", "why": "writes HLO dumps"}], "command": "jaxmem analyze x",
         "with_flags": _run(True, 30 * 2**30, ran.step_s * 3), "without_flags": _run(True, 29 * 2**30, 1.0),
         "other_attention": {"attention": "xla", "command": "jaxmem analyze x --arg attention=xla",
                             "run": _run(False, 70 * 2**30, 4.0)}},
        {"recipe": {**dataclasses.asdict(oom), "why": "a reason"}, "attention_run": "xla", "flags_applied": [],
         "flags_dropped": [], "command": "jaxmem analyze y", "with_flags": _run(True, 50 * 2**30, 2.0)},
        {"recipe": dataclasses.asdict(ran), "attention_run": "cudnn", "flags_applied": [], "flags_dropped": [],
         "command": "jaxmem analyze z", "with_flags": {"exit": 1, "seconds": 1.0, "error": "jaxmem bug: boom"}},
    ]
    md = pub.render(results, {"when": "today", "jax": "0.0", "attention": "xla"})
    assert "Not a GPU measurement" in md
    rows = [line for line in md.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert "fits (agrees)" in rows[0] and "(outside 0.75-1.33)" in rows[0] and "29.00 GiB, fits" in rows[0]
    assert rows[0].endswith("| xla: 70.00 GiB, does not fit, 4.000 |")   # the other kernel's column
    assert "- **With attention=xla** (`jaxmem analyze x --arg attention=xla`): peak 70.00 GiB, does not fit" in md
    # the published time at XLA's FLOP count: _run's flops / the recipe's step time, against its peak
    rate = 500 / ran.step_s   # TFLOP/s
    assert (f"- **Published time at XLA's FLOP count**: 500.0 TFLOP per device (XLA's count, loops x trip count) "
            f"in {ran.step_s:g} s: {rate:.0f} TFLOP/s, {rate / 10:.0f}% of the 1000 TFLOP/s") in md
    assert "fits (DISAGREES)" in rows[1] and "(no flags)" in rows[1] and rows[1].endswith("| — |")
    assert "- **Why they differ**: a reason" in md
    assert "error (exit 1)" in md and "`--xla_dump_to=/x` (writes HLO dumps)" in md
    assert "Verdicts: 1 of 3 agree" in md
    assert "- With the other attention kernel (last column): 0 of 1 of those rows' verdicts agree with the record; " \
           "row 1 disagrees." in md


def test_rerender_takes_the_recipes_why_and_refuses_a_changed_command(pub):
    import copy
    import dataclasses

    r = pub.RECIPES[0]
    flags, _ = pub.applicable_flags(r.xla_flags, known=lambda fs: [])
    res = {"recipe": {**dataclasses.asdict(r), "why": "old text"}, "attention_run": r.attention,
           "command": pub.command_line(pub.analyze_argv(r, r.attention), flags)}
    pub_flags = pub.applicable_flags
    try:
        pub.applicable_flags = lambda flags: pub_flags(flags, known=lambda fs: [])
        out = pub.rerender({"header": {}, "results": [copy.deepcopy(res)]})
        assert out["results"][0]["recipe"]["why"] == r.why
        with pytest.raises(SystemExit, match="command changed"):
            pub.rerender({"header": {}, "results": [{**res, "command": res["command"] + " --batch 1"}]})
    finally:
        pub.applicable_flags = pub_flags

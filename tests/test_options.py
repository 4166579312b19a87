"""One definition of the options: every field has its flag, the CLI's parser and command_line
agree on all of them, and the names each choice accepts are the ones the implementations know."""
import dataclasses
import shlex

from jaxmem.cli import _options, main
from jaxmem.program import options


def _options_from(argv: list[str], command: str = "analyze") -> options.AnalyzeOptions:
    """The AnalyzeOptions the CLI builds from a command line."""
    cmd = main.commands[command]
    params = dict(cmd.make_context(command, list(argv[1:])).params)
    return _options({k: v for k, v in params.items() if k in {f.name for f in dataclasses.fields(options.AnalyzeOptions)}})


# every field at a value other than its default
EVERYTHING = options.AnalyzeOptions(
    model_args=(("preset", "8b"), ("seq_len", 4096), ("flag", True), ("name", "a b"), ("none", None), ("x", 0.5)),
    mesh="data=4,model=2", layout="fsdp_tp", precision="bf16", optimizer="adafactor", batch=64, accum=4,
    remat="dots_saveable", donate=False, freeze="embed.*", lora_rank=16, lora_targets="attn", lora_alpha=32.0,
    base_dtype="nf4", offload="optimizer", gpu="rtx-a6000", hosts=2, mem_fraction=0.9, explain=False, top=5,
    module_depth=2, cache=False, rules="my rules.json", axis_types="explicit", remat_at="^Block$", pipeline="circular",
    microbatches=8, repeats=2, stage_remat=True, axis_roles="data=data", train_all=True,
    moment_dtype="bf16", unmapped="replicate", allocator="cuda_async")


def test_every_field_has_a_flag_and_the_round_trip_sets_every_field():
    fields = dataclasses.fields(options.AnalyzeOptions)
    assert [f.name for f, _ in options.flagged()] == [f.name for f in fields]
    defaults = options.AnalyzeOptions()
    assert all(getattr(EVERYTHING, f.name) != getattr(defaults, f.name) for f in fields)


def test_command_line_round_trips_through_the_cli_parser():
    text = options.command_line("models/llama.py", EVERYTHING)
    args = shlex.split(text)
    assert args[:3] == ["jaxmem", "analyze", "models/llama.py"]
    assert _options_from(args[1:]) == EVERYTHING


def test_command_line_writes_only_the_flags_a_command_has():
    text = options.command_line("m.py", EVERYTHING, "advise")
    assert "--mem-fraction 0.9" in text                          # advise has it
    assert not {"--top", "--depth", "--no-explain", "--no-cache"} & set(shlex.split(text))
    back = _options_from(shlex.split(text)[1:], "advise")
    display = {"explain", "top", "module_depth", "cache"}
    assert all(getattr(back, f.name) == getattr(EVERYTHING, f.name)
               for f in dataclasses.fields(back) if f.name not in display)


def test_command_line_leaves_defaults_out_except_the_flags_always_written():
    assert options.command_line("m.py", options.AnalyzeOptions()) == \
        "jaxmem analyze m.py --mesh data=1 --layout fsdp --precision fp32 --remat none"


def test_every_step_command_has_the_shared_flags_and_its_own():
    for name in ("analyze", "compare", "advise", "verify"):
        params = {p.name for p in main.commands[name].params}
        for f, flag in options.flagged():
            assert (f.name in params) == (flag.shared or name in flag.commands), (name, f.name)


def test_the_choices_are_the_names_the_implementations_know():
    import jax

    from jaxmem.program import finetune, layouts, state

    assert tuple(state.OPTIMIZERS) == options.OPTIMIZER_NAMES
    assert layouts.LAYOUTS is options.LAYOUTS and finetune.BASE_DTYPES is options.BASE_DTYPES
    for name in options.REMAT_POLICIES[2:]:   # the rest are jax.checkpoint_policies of that name ...
        if name != "offload_dots":   # ... but offload_dots, jax's offload_dot_with_no_batch_dims to pinned host
            assert callable(getattr(jax.checkpoint_policies, name))

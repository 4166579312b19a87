"""The docs run as printed: generated reference, samples from real runs, the model-file example."""

import json
import sys

import pytest
from click.testing import CliRunner

import jaxmem
from jaxmem import cli

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("name", jaxmem.REMAT_POLICIES)
def test_remat_policy_answers_every_remat_value(name):
    import jax

    policy = jaxmem.remat_policy(name)
    assert callable(policy)
    if name == "none":  # recompute nothing: the recipe `nn.remat(Block, policy=...)` works at the default
        assert policy is jax.checkpoint_policies.everything_saveable
    if name == "full":
        assert policy is jax.checkpoint_policies.nothing_saveable


def test_remat_policy_refuses_an_unknown_name():
    with pytest.raises(ValueError, match="known: none, full"):
        jaxmem.remat_policy("some")


def _peak(*args):
    r = invoke("analyze", FIX / "remat_none.py", "--gpu", "h100", "--json", *args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    return d["per_device_peak_bytes"], d["xla"]["temp"]


def test_remat_none_saves_everything_like_no_remat():
    """nn.remat(policy=remat_policy("none")) without CSE barriers compiles to the unwrapped step's memory."""
    unwrapped = _peak("--arg", "wrap=false")
    assert _peak("--arg", "wrap=true", "--arg", "prevent_cse=false") == unwrapped


def test_compare_help_says_json_is_a_list():
    """compare --json prints a list of rows (jaxmem/plan/compare.py: to_json), not one object."""
    text = invoke("compare", "--help").output
    assert "JSON list" in text and "one JSON object" not in text
    assert "one JSON object" in invoke("analyze", "--help").output  # analyze's is one object


def _script(name):
    """A docs/ script as a module (docs/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"docs_{name}", ROOT / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_generated_from_every_commands_help():
    gen = _script("gen_cli")
    fresh = gen.render()
    for name in cli.main.commands:  # every command, each exactly as its --help prints it
        assert f"## `jaxmem {name}`" in fresh
    printed = CliRunner().invoke(cli.main, ["gpus", "--help"], prog_name="jaxmem").output
    assert printed.rstrip() in fresh
    committed = (ROOT / "docs" / "cli.md").read_text()
    assert fresh == committed, "docs/cli.md is out of date: run `python docs/gen_cli.py` and commit docs/cli.md"


def model_example(doc: str) -> tuple[str, list[str]]:
    """A page's model-file example (the Python block after `<!-- model-file example -->`, else its first)
    and the commands printed under "Saved as `my_model.py`:"."""
    text = (ROOT / doc).read_text()
    if "<!-- model-file example -->" in text:
        text = text.split("<!-- model-file example -->", 1)[1]
    code = text.split("```python\n", 1)[1].split("\n```", 1)[0] + "\n"
    after = text.split("Saved as `my_model.py`:", 1)[1]
    commands = after.split("```bash\n", 1)[1].split("\n```", 1)[0].splitlines()
    return code, [c for c in commands if c.strip() and not c.startswith("#")]


@pytest.mark.parametrize("doc", ["README.md", "docs/model-files.md"])
def test_model_example_runs_with_its_printed_command(doc, tmp_path, monkeypatch):
    import shlex

    code, commands = model_example(doc)
    (tmp_path / "my_model.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    assert commands
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "jaxmem", command
        r = invoke(*argv[1:])
        assert r.exit_code == 0, f"{doc}: `{command}` exited {r.exit_code}:\n{r.output}"
        assert "my_model" in r.output


def test_model_file_example_runs_at_the_default_remat_none(tmp_path):
    """Its printed command uses --remat full (nn.remat with static_argnums); the default skips nn.remat."""
    path = tmp_path / "my_model.py"
    path.write_text(model_example("docs/model-files.md")[0])
    r = invoke("analyze", path, "--gpu", "h100", "--mesh", "data=8", "--batch", "64", "--no-explain", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["options"]["remat"] == "none" and d["model"] == "my_model"
    assert d["param_count"] > 3_000_000 and d["breakdown"]["other_state"] > 0  # BatchNorm's batch_stats


SAMPLES = _script("gen_samples").SAMPLES


@pytest.mark.holds_for(_script("gen_samples").SAMPLES_JAX)
@pytest.mark.parametrize("name", [s.name for s in SAMPLES])
def test_pasted_output_equals_a_fresh_run(name):
    """Each output pasted in README.md / docs/*.md is what its command prints now (timing lines aside)."""
    gen = _script("gen_samples")
    sample = next(s for s in gen.SAMPLES if s.name == name)
    fresh = gen.comparable(sample, gen.run(sample))
    assert fresh == gen.comparable(sample, gen.committed(sample)), (
        f"{sample.file}: the output of `{sample.command}` changed: run `python docs/gen_samples.py {name}` "
        "and commit the file")


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    import re

    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_links_between_the_docs_resolve():
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def documented_commands() -> list[tuple[str, str]]:
    """(page, command) for every `jaxmem ...` line of a code block in README.md and docs/*.md
    (`$ ` prompts dropped, backslash continuations joined); docs/cli.md's usage texts aside."""
    import re

    out = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if page.name == "cli.md":
            continue
        for block in re.findall(r"```[a-z]*\n(.*?)```", page.read_text(), flags=re.S):
            lines = [line.strip() for line in block.replace("\\\n", " ").splitlines()]
            if any(line.startswith("$ ") for line in lines):  # a session: its commands are the prompted lines
                lines = [line[2:] for line in lines if line.startswith("$ ")]
            out += [(str(page.relative_to(ROOT)), line) for line in lines if line.startswith("jaxmem ")]
    return out


@pytest.mark.parametrize("page,command", documented_commands())
def test_documented_command_parses(page, command):
    """Each command in the docs is one the CLI accepts: its options exist, its values check, its file is
    there (running them all would take hours; the samples above run theirs)."""
    import shlex

    import click

    import itertools

    # the shell's part of the line (a redirection, a pipe, a next command) is not the CLI's
    words = shlex.split(command, comments=True)
    argv = list(itertools.takewhile(lambda w: w not in (">", ">>", "|", "&&", ";", "2>"), words))[1:]
    root = cli.main.make_context("jaxmem", [argv[0]], resilient_parsing=False)
    cmd = cli.main.get_command(root, argv[0])
    assert cmd is not None, f"{page}: no command {argv[0]!r}"
    try:
        ctx = cmd.make_context(argv[0], argv[1:], parent=root)
    except click.ClickException as e:
        pytest.fail(f"{page}: `{command}`: {e.format_message()}")
    model = ctx.params.get("model_file")
    if model and model != "my_model.py":  # the example a page asks you to save
        assert (ROOT / model).exists(), f"{page}: `{command}`: no file {model}"

"""Rewrite the command outputs pasted in README.md and docs/*.md from real runs.

    python docs/gen_samples.py           # run every sample's command, rewrite its block
    python docs/gen_samples.py --check   # exit 1 when a committed block differs from a fresh run

A sample is a block of a Markdown file between

    <!-- sample NAME -->
    ...
    <!-- /sample -->

and its content is generated here: the command (as a user types it) and what it printed. Commands
run in this process through click (`jaxmem.cli.main`), from the repository root, with the shipped
runtime values (no calibration file) and a fixed terminal width, so the output is the same on every
machine with the same versions: those of README command 1 on a fresh machine with Python 3.11
(SAMPLES_JAX, and the flax, optax and CUDA plugin it resolves). tests/test_docs.py runs them again
under that jax and compares: exactly, except the lines a sample marks as volatile (the wall-clock
timings of a run) and, in JSON, `versions` (the Python patch release and the like are the machine's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import re
import shlex
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent

COMMAND_1 = "jaxmem analyze models/llama.py --mesh data=8 --remat full --precision bf16"  # README, Setup
# The jax the pasted outputs come from: what `pip install -e ".[cuda12]"` resolves on Python 3.11
SAMPLES_JAX = "0.10.2"


@dataclasses.dataclass(frozen=True)
class Sample:
    name: str
    file: str  # the Markdown file holding the block, relative to the root
    command: str  # what a user types; run as printed
    kind: str = "text"  # text: the terminal output; json: the JSON, lists of objects cut to their first
    columns: int = 118  # the terminal width the text is rendered at
    excerpt: tuple[str, str] | None = None  # text: keep from the line matching the first regex to the one
    # before the line matching the second (None: to the end)
    volatile: tuple[str, ...] = ()  # regexes of lines that differ run to run (timings): not compared
    keys: tuple[str, ...] = ()  # json: only these top-level keys (all when empty)
    exit_code: int = 0


SAMPLES = (
    Sample("command-1", "README.md", COMMAND_1, volatile=(r"^lowered in ",)),
    Sample("command-1-json", "docs/json.md", COMMAND_1 + " --json", kind="json", volatile=(r'^\s*"python": ',)),
    Sample("finetune-json", "docs/json.md",
           "jaxmem analyze models/llama.py --arg preset=tiny --gpu h100 --mesh data=8 --batch 8 --lora 8 "
           "--base-dtype nf4 --offload optimizer --json", kind="json",
           keys=("options", "breakdown", "trainable_param_count", "frozen_param_count", "trainable_bytes",
                 "frozen_bytes", "host")),
    Sample("runtime-fsdp-tp", "docs/runtime.md",
           "jaxmem analyze models/llama.py --arg preset=tiny --arg batch_size=16 --mesh data=4,model=2 --layout fsdp_tp",
           excerpt=(r"^runtime per device", r"^largest buffers")),
    Sample("runtime-tight", "docs/runtime.md",
           "jaxmem analyze models/llama.py --arg preset=tiny --arg batch_size=16 --mesh data=4,model=2 --layout fsdp_tp "
           "--mem-fraction 0.97", excerpt=(r"^ TIGHT ", r"^XLA held this step")),
    Sample("runtime-tight-warning", "docs/runtime.md",
           "jaxmem analyze models/llama.py --arg preset=tiny --arg batch_size=16 --mesh data=4,model=2 --layout fsdp_tp "
           "--mem-fraction 0.97", excerpt=(r"^warning \[verdict_tight\]", r"^largest buffers")),
    Sample("runtime-out-of-pool", "docs/runtime.md",
           "jaxmem analyze models/llama.py --arg preset=tiny --arg batch_size=16 --mesh data=4,model=2 --layout fsdp_tp "
           "--mem-fraction 0.99", excerpt=(r"^warning \[runtime_out_of_pool\]", r"^largest buffers"), exit_code=3),
    Sample("gpus", "docs/runtime.md", "jaxmem gpus"),
    Sample("advise-tiny", "docs/planning.md",
           "jaxmem advise models/llama.py --arg preset=tiny --arg seq_len=256 --batch 8 --gpu h100 --mesh data=1 "
           "--layout dp --mem-fraction 0.000988 --changes precision,remat,accum", volatile=(r"^\d+ compiles \(",)),
)

BEGIN = re.compile(r"^<!-- sample (\S+) -->\n", re.M)
END = "<!-- /sample -->"


def shorten(x):
    """Lists of objects (or of lists) cut to their first element; numbers and strings kept whole."""
    if isinstance(x, dict):
        return {k: shorten(v) for k, v in x.items()}
    if isinstance(x, list):
        if x and all(isinstance(v, (dict, list)) for v in x):
            return [shorten(x[0])]
        return x
    return x


@contextlib.contextmanager
def _hermetic(cache_dir: str | None):
    """Run from the root with the shipped runtime values; a fresh compile cache when asked."""
    saved_cwd, saved_env = os.getcwd(), dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="jaxmem-samples-") as tmp:
        os.environ["JAXMEM_CALIBRATION"] = os.path.join(tmp, "no-calibration.json")
        if cache_dir is not None:
            os.environ["JAXMEM_CACHE"] = cache_dir
        os.environ.pop("COLUMNS", None)
        os.chdir(ROOT)
        try:
            yield tmp
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)


def run(sample: Sample, *, fresh_cache: bool = False) -> str:
    """The block's content for `sample`: its command and what it printed, from a real run."""
    from click.testing import CliRunner

    sys.path.insert(0, str(ROOT))  # this checkout's jaxmem, whatever is installed
    from jaxmem import cli

    argv = shlex.split(sample.command)
    assert argv[0] == "jaxmem", sample.command
    with _hermetic(None) as tmp:
        if fresh_cache:
            os.environ["JAXMEM_CACHE"] = os.path.join(tmp, "cache")
        r = CliRunner().invoke(cli.main, argv[1:], prog_name="jaxmem", env={"COLUMNS": str(sample.columns)},
                               catch_exceptions=False)
    out = r.stdout if hasattr(r, "stdout") else r.output
    if r.exit_code != sample.exit_code:
        raise RuntimeError(f"`{sample.command}` exited {r.exit_code} (expected {sample.exit_code}):\n{r.output}")
    if sample.kind == "json":
        d = json.loads(out)
        what = "lists of objects cut to their first element"
        if sample.keys:
            d = {k: d[k] for k in sample.keys}
            what = "these keys of its output"
        body = json.dumps(shorten(d), indent=2)
        return f"`{sample.command}` prints ({what}):\n\n```json\n{body}\n```\n"
    lines = [line.rstrip() for line in out.splitlines()]
    if sample.excerpt:
        start = next(i for i, line in enumerate(lines) if re.search(sample.excerpt[0], line))
        stop = next((i for i, line in enumerate(lines[start:], start) if re.search(sample.excerpt[1], line)), len(lines))
        lines = ["..."] + lines[start:stop] + (["..."] if stop < len(lines) else [])
    return "```\n$ " + sample.command + "\n" + "\n".join(lines) + "\n```\n"


def blocks(text: str) -> dict[str, tuple[int, int]]:
    """Each sample block of a Markdown text: name -> (start, end) of its content."""
    out = {}
    for m in BEGIN.finditer(text):
        end = text.find(END, m.end())
        if end < 0:
            raise ValueError(f"sample {m.group(1)}: no {END}")
        out[m.group(1)] = (m.end(), end)
    return out


def committed(sample: Sample) -> str:
    text = (ROOT / sample.file).read_text()
    spans = blocks(text)
    if sample.name not in spans:
        raise KeyError(f"{sample.file} has no block <!-- sample {sample.name} -->")
    a, b = spans[sample.name]
    return text[a:b]


def comparable(sample: Sample, content: str) -> str:
    """The content without its volatile lines."""
    return "\n".join(line for line in content.splitlines()
                     if not any(re.search(v, line) for v in sample.volatile))


def write(sample: Sample, content: str) -> None:
    path = ROOT / sample.file
    text = path.read_text()
    a, b = blocks(text)[sample.name]
    path.write_text(text[:a] + content + text[b:])


def main(argv: list[str]) -> int:
    names = [a for a in argv if not a.startswith("-")]
    chosen = [s for s in SAMPLES if not names or s.name in names]
    stale = []
    for s in chosen:
        content = run(s, fresh_cache="--check" not in argv)  # a written sample's timings are a cold compile's
        if "--check" in argv:
            if comparable(s, content) != comparable(s, committed(s)):
                stale.append(s)
        else:
            write(s, content)
            print(f"{s.file}: sample {s.name} ({len(content.splitlines())} lines)")
    for s in stale:
        print(f"{s.file}: sample {s.name} differs from `{s.command}`: run `python docs/gen_samples.py {s.name}`",
              file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    # the test suite's environment (tests/conftest.py), before jax starts: its forced CPU devices are
    # in XLA_FLAGS, which the JSON samples' xla_flags report (as dropped from the GPU compile)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    sys.exit(main(sys.argv[1:]))

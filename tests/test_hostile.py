"""Issue 35's hostile inputs (trust, round three), one test per class: what a user or a hostile
colleague can hand jaxmem, and the one clear answer (exit 2 naming the culprit) each must get.
Each is a promise the probes table (benchmarks/probes.py) can run too."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner

from jaxmem import cli

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
MLP = os.path.join(FIX, "mlp_small.py")
NOSUCH = os.path.join(FIX, "no_such_model.py")


def invoke(*args, env=None):
    return CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False, env=env)


# ------------------------------------------------------------------ 1. only regular files are written

def _fifo(tmp_path):
    p = tmp_path / "fifo"
    os.mkfifo(p)
    return p


def _socket(tmp_path):
    p = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()
    return p


def _link_to_stdout(tmp_path):
    p = tmp_path / "out.png"
    os.symlink("/proc/self/fd/1", p)
    return p


def _link_to_dev_null(tmp_path):
    p = tmp_path / "null.html"
    os.symlink("/dev/null", p)
    return p


def _device_copy(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    p = tmp_path / "null-copy"
    os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))   # a copy of /dev/null
    return p


NODES = [_fifo, _socket, _link_to_stdout, _link_to_dev_null, _device_copy]
OUTPUT_COMMANDS = [
    ("analyze", "--png"), ("analyze", "--html"), ("compare", "--html"), ("compare", "--png"), ("verify", "--html")]


@pytest.mark.parametrize("make", NODES, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("command,option", OUTPUT_COMMANDS, ids=lambda x: x)
def test_an_output_aimed_at_a_device_fifo_socket_or_proc_link_is_refused_before_any_work(tmp_path, make, command,
                                                                                          option):
    node = make(tmp_path)
    before = os.lstat(node)
    extra = ("--batches", "8,16") if command == "compare" else ()
    r = invoke(command, MLP, "--gpu", "h100", *extra, option, node)
    assert r.exit_code == 2, r.output
    assert option in r.output and "not a regular file" in r.output, r.output
    after = os.lstat(node)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)   # untouched


@pytest.mark.parametrize("make", NODES, ids=lambda f: f.__name__.strip("_"))
def test_compare_out_aimed_at_a_special_file_is_refused(tmp_path, make):
    node = make(tmp_path)
    if not str(node).endswith(".json"):
        link = tmp_path / "rows.json"
        os.symlink(node, link)
        node = link
    r = invoke("compare", MLP, "--gpu", "h100", "--batches", "8,16", "--out", node)
    assert r.exit_code == 2 and "--out" in r.output and "not a regular file" in r.output, r.output


def test_the_writer_itself_refuses_a_fifo_that_appeared_after_the_check(tmp_path):
    from jaxmem import files

    p = _fifo(tmp_path)
    with pytest.raises(OSError, match="not a regular file"):
        files.write_output(p, b"x", option="--png")
    assert stat.S_ISFIFO(os.lstat(p).st_mode)


def test_a_link_to_a_regular_file_elsewhere_keeps_todays_rule(tmp_path):
    """A link to a regular file is replaced (the link), never written through."""
    from jaxmem import files
    from jaxmem.present import outputs

    target = tmp_path / "target.html"
    target.write_text("theirs")
    link = tmp_path / "page.html"
    os.symlink(target, link)
    outputs.check_all([("--html", str(link))])
    files.write_output(link, b"ours", option="--html")
    assert target.read_text() == "theirs" and link.read_text() == "ours" and not link.is_symlink()


@pytest.mark.parametrize("command,args", [
    ("analyze", ("--html", "{d}/a.html", "--png", "{d}/a.html")),
    ("analyze", ("--html", "{d}/a.html", "--png", "{d}/sub/../a.html")),
    ("compare", ("--batches", "8,16", "--html", "{d}/a.html", "--png", "{d}/a.html")),
    ("compare", ("--batches", "8,16", "--out", "{d}/rows.json", "--html", "{d}/rows.json")),
])
def test_two_outputs_of_one_command_on_the_same_path_are_refused(tmp_path, command, args):
    (tmp_path / "sub").mkdir()
    r = invoke(command, MLP, "--gpu", "h100", *(a.format(d=tmp_path) for a in args))
    assert r.exit_code == 2, r.output
    assert "both write" in r.output, r.output
    assert not (tmp_path / "a.html").exists() and not (tmp_path / "rows.json").exists()


@pytest.mark.parametrize("command,option", [*OUTPUT_COMMANDS, ("compare", "--out")], ids=lambda x: x)
def test_an_empty_output_path_is_refused_naming_the_option(command, option):
    extra = ("--batches", "8,16") if command == "compare" else ()
    r = invoke(command, MLP, "--gpu", "h100", *extra, option, "")
    assert r.exit_code == 2, r.output
    assert f"{option} ''" in r.output, r.output


# ------------------------------------------------------------------ 3 + 5. diff: linear, and it validates what it reads

GOLDEN = os.path.join(FIX, "golden", "jax-0.10.2", "gpt2-data8-fsdp.json")


def _report(tmp_path, name="r.json", edit=None, raw=None):
    with open(GOLDEN) as f:
        d = json.load(f)
    if edit:
        edit(d)
    p = tmp_path / name
    p.write_text(raw(json.dumps(d)) if raw else json.dumps(d))
    return p


def _set(path, value):
    def edit(d):
        *head, last = path
        x = d
        for k in head:
            x = x[k]
        x[last] = value
    return edit


@pytest.mark.parametrize("edit,raw,field", [
    (_set(("per_device_peak_bytes",), 10**400), None, "per_device_peak_bytes"),
    (_set(("breakdown", "params"), 10**400), None, "breakdown.params"),
    (_set(("modules", 0, "bytes"), 10**400), None, "modules[0].bytes"),
    (_set(("modules", 0, "bytes"), "PLACEHOLDER"), lambda t: t.replace('"PLACEHOLDER"', "NaN"), "modules[0].bytes"),
    (_set(("modules", 0, "bytes"), "PLACEHOLDER"), lambda t: t.replace('"PLACEHOLDER"', "Infinity"),
     "modules[0].bytes"),
    (_set(("modules", 0, "bytes"), "12"), None, "modules[0].bytes"),
    (lambda d: d["modules"][0].pop("bytes"), None, "modules[0].bytes"),
    (lambda d: d["modules"][0].pop("module_path"), None, "modules[0].module_path"),
    (_set(("modules",), 5), None, "modules"),
    (_set(("modules", 0), 5), None, "modules[0]"),
    (_set(("top_buffers", 0, "size"), -1), None, "top_buffers[0].size"),
    (_set(("top_buffers",), "x"), None, "top_buffers"),
    (_set(("options", "mem_fraction"), "PLACEHOLDER"), lambda t: t.replace('"PLACEHOLDER"', "NaN"),
     "options.mem_fraction"),
])
def test_diff_refuses_a_report_with_a_number_or_row_it_cannot_hold_naming_the_field(tmp_path, edit, raw, field):
    bad = _report(tmp_path, "bad.json", edit, raw)
    for args in ((GOLDEN, bad), (bad, GOLDEN), (bad, bad)):
        r = invoke("diff", *args, "--json")
        assert r.exit_code == 2, r.output
        assert field in r.output and "Traceback" not in r.output and "bug" not in r.output, r.output


def _placeholder(text):
    return lambda t: t.replace('"PLACEHOLDER"', text)


@pytest.mark.parametrize("raw", [
    _placeholder("1e400"), _placeholder("1E+400"), _placeholder("-Infinity"), _placeholder("1" + "0" * 400 + ".5"),
    _placeholder("-" + "9" * 19), _placeholder("9223372036854775808"),
    lambda t: _placeholder("NaN")(t).encode("utf-16"),    # texts the byte search cannot read: the walk reads them
    lambda t: _placeholder("1e400")(t).encode("utf-32"),
], ids=["1e400", "1E+400", "-Infinity", "401 digits", "-19 nines", "2^63", "NaN utf-16", "1e400 utf-32"])
def test_diff_finds_every_number_out_of_bounds_whatever_its_spelling_or_encoding(tmp_path, raw):
    bad = tmp_path / "bad.json"
    with open(GOLDEN) as f:
        d = json.load(f)
    text = raw(json.dumps({**d, "options": {**d["options"], "x": "PLACEHOLDER"}}))   # no byte count: only that check
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    r = invoke("diff", GOLDEN, bad, "--json")
    assert r.exit_code == 2 and "options.x" in r.output and "Traceback" not in r.output, r.output


def test_diff_reads_a_report_whose_text_only_looks_out_of_bounds(tmp_path):
    """19 digits in a name, the largest byte count, an exponent in a name: the text's first look flags
    them, the look at each value clears them."""
    name = "layers_1234567890123456789/e+400/NaN/Infinity"
    with open(GOLDEN) as f:
        d = json.load(f)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**d, "modules": [{"module_path": name, "bytes": 2**63 - 1}]}))
    r = invoke("diff", GOLDEN, old, "--json")
    assert r.exit_code == 0, r.output
    assert {"name": name, "old": 0, "new": 2**63 - 1, "delta": 2**63 - 1, "change": "added"} in \
        json.loads(r.output)["modules"]


@pytest.mark.parametrize("name", ["[/bold]", "[link=https://example.com]click[/link]", "[red]x"])
def test_diff_prints_part_and_module_names_literally(tmp_path, name):
    def edit(d):
        d["breakdown"][name] = 1
        d["modules"].append({"module_path": name, "bytes": 5, "buffers": 1})
    old = _report(tmp_path, "old.json")
    new = _report(tmp_path, "new.json", edit)
    r = invoke("diff", old, new)
    assert r.exit_code == 0, r.output
    assert r.output.count(name) >= 2, r.output   # the breakdown's row and the module's, as written
    assert "\x1b]8;" not in r.output   # no terminal hyperlink


def test_a_report_diffed_with_itself_shows_no_change_and_its_json_is_strict(tmp_path):
    r = invoke("diff", GOLDEN, GOLDEN, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert d["peak"]["delta"] == 0 and d["modules"] == [] and d["buffers"] == [] and d["settings"] == {}
    assert all(row["delta"] == 0 for row in d["breakdown"])


class _CountingName(str):
    """A name that counts its comparisons: a list membership test per name compares it with every other."""
    compared = 0

    def __eq__(self, other):
        type(self).compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_diff_matches_modules_in_linear_time():
    from jaxmem.plan import diff

    n = 3000
    old = {_CountingName(f"m{i}"): i for i in range(n)}
    new = {_CountingName(f"m{i}"): i + (i % 2) for i in range(n + n // 2)}
    _CountingName.compared = 0
    changes = diff._changes(old, new)
    assert len(changes) == n // 2 + n // 2   # the odd ones grew, the half added
    assert _CountingName.compared < 10 * n, _CountingName.compared   # a list scan would be ~n^2 / 2
    _CountingName.compared = 0
    diff._changes({**old, **{_CountingName(k): 1 for k in ("params", "gradients")}}, new, order=("params",))
    assert _CountingName.compared < 10 * n, _CountingName.compared


# ------------------------------------------------------------------ 3. the default microbatch search from the divisors

def _bounded_range(limit: int):
    def r(*args):
        out = range(*args)
        if len(out) > limit:
            raise AssertionError(f"a walk over {len(out):,} integers")
        return out
    return r


@pytest.mark.parametrize("stages,batch,data,expect", [
    (2, 2_000_000_000, 1, 2), (2, 2_147_483_647, 1, 2_147_483_647), (4, 2**62, 8, 4),
    (3, 999_999_937 * 999_999_929, 1, 999_999_929), (2, 2**61 - 1, 2, None), (8, 12, 1, 12), (8, 6, 1, None),
])
def test_the_default_microbatches_come_from_the_batchs_divisors_not_a_walk_up_to_it(monkeypatch, stages, batch,
                                                                                     data, expect):
    from jaxmem.program import divisors, pipeline_stages

    for module in (pipeline_stages, divisors):   # the search and the factoring it rests on
        monkeypatch.setattr(module, "range", _bounded_range(10_000), raising=False)
    assert pipeline_stages.default_microbatches(stages, batch, data) == expect


def test_the_default_microbatches_are_the_smallest_that_keep_every_stage_busy():
    """The old walk's answer on every small case: the smallest M >= N dividing batch/data, a multiple of N first."""
    from jaxmem.program import pipeline_stages

    for stages in range(1, 7):
        for data in (1, 2, 3, 4):
            for batch in range(1, 200):
                fits = [m for m in range(stages, batch + 1) if batch % m == 0 and (batch // m) % data == 0]
                want = next((m for m in fits if m % stages == 0), fits[0] if fits else None)
                assert pipeline_stages.default_microbatches(stages, batch, data) == want, (stages, batch, data)


# ------------------------------------------------------------------ 4. every grid value checked before compiling

@pytest.mark.parametrize("value,bad", [("0", "0"), ("0,4", "0"), ("-2,4", "-2"), ("4,x", "x")])
def test_compare_microbatches_are_checked_as_analyzes_are_before_any_compile(value, bad):
    r = invoke("compare", MLP, "--gpu", "h100", "--mesh", "stage=2", f"--microbatches={value}")
    assert r.exit_code == 2, r.output
    assert "--microbatches" in r.output and repr(bad) in r.output, r.output
    single = invoke("analyze", MLP, "--gpu", "h100", "--mesh", "stage=2", f"--microbatches={bad}")
    assert single.exit_code == 2 and single.output.strip().splitlines()[-1].split(": ")[-1] in r.output


@pytest.mark.parametrize("kw,culprit", [
    ({"microbatches": [0, 4]}, "microbatches"), ({"microbatches": [-2]}, "microbatches"),
    ({"batches": [0, 8]}, "batches"), ({"loras": [-1]}, "loras"),
])
def test_the_api_grid_is_checked_before_any_compile(kw, culprit):
    import jaxmem

    with pytest.raises(jaxmem.UserError, match=culprit):
        jaxmem.compare(MLP, gpu="h100", mesh="stage=2", jobs=1, **kw)


# a grid's stage count of 0 (compare's stage axis is the mesh's, in --mesh or the --meshes grid) and a batch grid's
# zero or negative batch: exit 2 with analyze's own words for the value, before jax is imported (so before any compile)
@pytest.mark.parametrize("option,value,bad", [
    ("--meshes", "stage=0;stage=2", "stage=0"), ("--meshes", "data=2,stage=0", "data=2,stage=0"),
    ("--mesh", "stage=0", "stage=0"),
    ("--batches", "0,4", "0"), ("--batches", "-4,4", "-4"), ("--batches", "8,-1", "-1"), ("--batches", "0", "0"),
])
def test_a_zero_stage_mesh_or_a_zero_or_negative_batch_in_compares_grid_is_exit_2_before_jax(option, value, bad):
    r = run_before_jax("compare", MLP, "--gpu", "h100", f"{option}={value}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "jax imported" not in r.stderr, r.stderr[-2000:]   # nothing compiled: jax was never even imported
    assert "Traceback" not in r.stderr and "bug" not in r.stderr, r.stderr[-2000:]
    assert option in r.stderr and repr(bad) in r.stderr, r.stderr[-2000:]
    single = "--batch" if option == "--batches" else "--mesh"
    analyze = run_before_jax("analyze", MLP, "--gpu", "h100", f"{single}={bad}")
    assert analyze.returncode == 2 and "jax imported" not in analyze.stderr, analyze.stderr[-2000:]
    why = analyze.stderr.strip().splitlines()[-1].split("': ")[-1]   # analyze's words for the value
    assert why in r.stderr, (why, r.stderr[-2000:])


_API_GRID = ("import sys, jaxmem\n"
             "try:\n    jaxmem.compare(sys.argv[1], gpu='h100', jobs=1, **eval(sys.argv[2]))\n"
             "except jaxmem.UserError as e:\n    print('UserError:', e)\n"
             "print('jax imported' if 'jax' in sys.modules else 'no jax')\n")


@pytest.mark.parametrize("kw,culprit,bad", [
    ({"batches": [0, 4]}, "batches", "0"), ({"batches": [8, -4]}, "batches", "-4"),
    ({"meshes": ["stage=0", "stage=2"]}, "meshes", "stage=0"), ({"mesh": "data=2,stage=0"}, "mesh", "data=2,stage=0"),
])
def test_the_api_refuses_a_zero_stage_mesh_or_a_zero_or_negative_batch_grid_before_jax(kw, culprit, bad):
    r = subprocess.run([sys.executable, "-c", _API_GRID, MLP, repr(kw)], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stdout.startswith("UserError:") and r.stdout.strip().endswith("no jax"), r.stdout
    assert culprit in r.stdout and repr(bad) in r.stdout, r.stdout
    if culprit == "batches":   # analyze's own words for the batch
        assert f"{bad} is not allowed: the global batch must be at least 1" in r.stdout, r.stdout


def _no_rows_run(monkeypatch):
    """Were the grid started, its first row fails the test at once (rather than compiling for hours)."""
    from jaxmem.plan import compare, runner

    # every planner's rows go through jaxmem.plan.runner (tests/test_sweep.py holds them to it)
    monkeypatch.setattr(runner, "open_runner", lambda *a, **k: pytest.fail("the grid started"))
    monkeypatch.setattr(compare, "_remat_at_block", lambda *a, **k: pytest.fail("the grid started"))


def test_a_grid_of_hundreds_of_rows_says_how_long_it_would_take_and_waits_for_yes(monkeypatch):
    _no_rows_run(monkeypatch)
    batches = ",".join(str(8 * i) for i in range(1, 51))
    r = invoke("compare", MLP, "--gpu", "h100", "--batches", batches, "--layouts", "dp,fsdp,tp,fsdp_tp",
               "--precisions", "fp32,bf16")
    assert r.exit_code == 2, r.output
    assert "400 rows" in r.output and "--yes" in r.output and ("minutes" in r.output or "hours" in r.output)


def test_the_api_asks_for_yes_true_on_a_large_grid(monkeypatch):
    import jaxmem

    _no_rows_run(monkeypatch)
    with pytest.raises(jaxmem.UserError, match=r"400 rows.*yes=True"):
        jaxmem.compare(MLP, gpu="h100", batches=list(range(1, 201)), precisions=["fp32", "bf16"], jobs=1)


def test_a_huge_grid_is_refused_before_its_rows_are_made(monkeypatch):
    from jaxmem.plan import compare

    spec = {"batch": ",".join(map(str, range(1, 1001))), "layout": "dp,fsdp,tp,fsdp_tp",
            "precision": "fp32,bf16,bf16-pure,fp8", "remat": "none,full,dots_saveable"}
    monkeypatch.setattr(compare, "_finetune_rows", lambda rows: pytest.fail("48,000 rows made"))
    with pytest.raises(compare.UserError, match="48,000 rows"):
        compare.grid(spec, yes=False)


# ------------------------------------------------------------------ 3. user regexes matched in bounded time (RE2)

CATASTROPHIC = "^(([a-z_/]+)+)+!$"   # Python's re: minutes on one 30-character path of [a-z_/]


def test_a_catastrophic_pattern_is_matched_in_linear_time_with_python_semantics():
    from jaxmem.program import patterns

    rx = patterns.compile_pattern(CATASTROPHIC, "--freeze")
    path = "layers/attention/query_projection/kernel" * 50   # 2,000 characters: Python's re would never end
    assert rx.search(path) is None and rx.search(path + "!") is not None
    for pattern, text, hit in [("attn|mlp", "layers/mlp/up", True), ("^embed", "x/embed", False),
                               (r"layers/\d+$", "layers/12", True), ("(?i)ATTN", "layers/attn", True),
                               ("head$", "head/kernel", False), ("a.c", "abc", True)]:
        assert (patterns.compile_pattern(pattern, "--freeze").search(text) is not None) == hit, pattern


@pytest.mark.parametrize("pattern,why", [
    ("(", "not a valid regular expression"), ("\\", "not a valid regular expression"),
    ("(?P<x", "not a valid regular expression"), (r"(a)\1", "backreferences"), ("x(?=y)", "lookaround"),
    ("(?<!x)y", "lookaround"),
])
@pytest.mark.parametrize("option", ["--freeze", "--lora-targets", "--remat-at"])
def test_a_pattern_rejected_or_only_matchable_by_backtracking_is_exit_2_before_jax(option, pattern, why):
    code = ("import sys; from jaxmem import cli\n"
            "sys.argv = ['jaxmem', 'analyze', sys.argv[1], sys.argv[2], sys.argv[3], '--lora', '4']\n"
            "try:\n    cli.entry()\nfinally:\n    assert 'jax' not in sys.modules, 'jax was imported'\n")
    r = subprocess.run([sys.executable, "-c", code, MLP, option, pattern], capture_output=True, text=True,
                       timeout=120, cwd=os.path.dirname(FIX) + "/..")
    assert r.returncode == 2, r.stderr
    assert option in r.stderr and why in r.stderr and "jax was imported" not in r.stderr, r.stderr


@pytest.mark.parametrize("option,field", [("--freeze", "freeze"), ("--lora-targets", "lora_targets")])
def test_the_finetune_patterns_are_matched_by_re2(monkeypatch, option, field):
    """Where the step is built, --freeze and --lora-targets go through jaxmem.program.patterns (RE2)."""
    from jaxmem.program import finetune, patterns
    from jaxmem.program.options import FineTune

    seen = []
    real = patterns.compile_pattern
    monkeypatch.setattr(patterns, "compile_pattern", lambda p, f, *a: seen.append(f) or real(p, f, *a))
    ft = FineTune(**{field: CATASTROPHIC}, lora_rank=4)
    finetune.check(ft)
    provider = finetune.provider(ft)
    assert option in seen
    if field == "lora_targets":
        deciders = provider.jaxmem_paths
        assert deciders and not deciders[0]("layers/attention/query_projection/kernel" * 20)
        assert all(r.module_path == ".*" for r in provider._rules)   # qwix's own re never sees the user's


def test_fp8_exclude_is_decided_by_re2_not_by_qwix():
    from jaxmem.program import fp8

    p = fp8.provider(CATASTROPHIC)
    assert [r.module_path for r in p._rules] == [".*"]
    assert p.jaxmem_paths[0]("layers/attention/query_projection" * 20)          # not excluded: FP8
    assert not p.jaxmem_paths[0]("layers/attention/query_projection!")         # excluded


def test_a_catastrophic_freeze_on_a_real_model_answers_at_once():
    """llama's parameter paths are long runs of [a-z_/]: Python's re ran past 120 s on the first."""
    r = subprocess.run([sys.executable, "-m", "jaxmem.cli", "analyze", "models/llama.py", "--arg", "preset=tiny",
                        "--gpu", "h100", "--freeze", CATASTROPHIC], capture_output=True, text=True, timeout=300,
                       cwd=os.path.join(FIX, "..", ".."))
    assert r.returncode == 2 and "matches no parameter path" in r.stderr, r.stderr[-2000:]


# ------------------------------------------------------------------ 7. --remat-at validated whether or not applied

@pytest.mark.parametrize("pattern,why", [("(", "not a valid regular expression"),
                                         ("\\", "not a valid regular expression"),
                                         ("(?P<x", "not a valid regular expression"),
                                         ("NoSuchBlock", "finds no module")])
def test_remat_at_is_checked_on_a_model_with_its_own_remat_hook(pattern, why):
    import jaxmem

    with pytest.raises(jaxmem.UserError, match=why):
        jaxmem.analyze("models/llama.py", args={"preset": "tiny"}, gpu="h100", remat="full", remat_at=pattern)


# ------------------------------------------------------------------ 6. environment values jax would reject

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NO_JAX = ("import sys; from jaxmem import cli\n"
           "sys.argv = ['jaxmem', *sys.argv[1:]]\n"
           "try:\n    cli.entry()\n"
           "finally:\n    print('jax imported' if 'jax' in sys.modules else '', file=sys.stderr)\n")


def run_before_jax(*args, env=None):
    """jaxmem ARGS in a child process; its stderr says 'jax imported' when jax was."""
    return subprocess.run([sys.executable, "-c", _NO_JAX, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("name,value", [
    ("JAX_ENABLE_X64", "garbage"), ("JAX_DEBUG_NANS", "maybe"), ("JAX_DEFAULT_PRNG_IMPL", "nope"),
    ("JAX_TRACEBACK_FILTERING", "loud"), ("JAX_SERIALIZATION_VERSION", "x"),
    ("XLA_FLAGS", "--xla_force_host_platform_device_count=0"),
    ("XLA_FLAGS", "--xla_gpu_autotune_level=0 --xla_force_host_platform_device_count=00"),
])
def test_an_environment_value_jax_would_reject_is_exit_2_naming_it_before_jax_starts(name, value):
    r = run_before_jax("analyze", MLP, "--gpu", "cpu", env={name: value})
    assert r.returncode == 2, r.stderr[-2000:]
    assert name in r.stderr and "jax imported" not in r.stderr and "bug" not in r.stderr, r.stderr[-2000:]


def test_the_jax_options_are_read_from_the_installed_jax_without_importing_it():
    from jaxmem import env

    env.jax_options.cache_clear()
    options = env.jax_options()
    assert options["JAX_ENABLE_X64"] == ("bool", ())
    assert options["JAX_DEFAULT_PRNG_IMPL"][0] == "enum" and "threefry2x32" in options["JAX_DEFAULT_PRNG_IMPL"][1]
    for good in ({"JAX_ENABLE_X64": "True"}, {"JAX_ENABLE_X64": "0"}, {"JAX_DEFAULT_PRNG_IMPL": "rbg"}):
        env.check_jax_config(good)


# ------------------------------------------------------------------ 2. a verdict only from candidates that compiled

@pytest.mark.parametrize("changes", ["pipeline", "expert,context"])
def test_advise_all_whose_changes_yield_nothing_reports_the_step_as_given_and_exits_0(changes):
    r = invoke("advise", MLP, "--gpu", "h100", "--all", "--changes", changes, "--jobs", "1")
    assert r.exit_code == 0, r.output
    assert "NONE FITS" not in r.output and "it fits" in r.output and "It fits as given" in r.output, r.output
    assert "none was tried" in r.output or "compiled" in r.output, r.output
    j = invoke("advise", MLP, "--gpu", "h100", "--all", "--changes", changes, "--jobs", "1", "--json")
    d = json.loads(j.output)
    assert j.exit_code == 0 and d["fits_as_given"] is True and d["closest"] is None, j.output
    assert d["changes_compiled"] == sum(c["per_device_peak_bytes"] is not None for c in d["candidates"])


def test_advise_verdict_comes_only_from_compiled_candidates():
    from jaxmem.plan.advise import Advice, Candidate

    class _R:
        fits = True

    original = Candidate((), None, _R(), None, "ok", 0)
    failed = Candidate((("layout", "tp"),), None, None, "boom", "failed", 1)
    a = Advice("m.py", original, (failed,), 1, 0, 1.0, searched=True)
    assert a.fits and a.compiled == [] and a.closest is None


# ------------------------------------------------------------------ 8. a huge name is not echoed in full

def test_a_100000_character_offload_name_is_not_echoed_in_full():
    name = "a" * 100_000
    r = run_before_jax("analyze", "models/llama.py", "--arg", "preset=tiny", "--gpu", "h100", "--remat",
                       f"offload:{name}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(r.stderr) < 5_000 and "100,000 characters" not in r.stderr and "characters]" in r.stderr


def test_a_user_error_clips_long_names_but_keeps_ordinary_messages():
    from jaxmem.errors import UserError

    assert str(UserError("--freeze 'x': no match")) == "--freeze 'x': no match"
    long = UserError(f"--remat offload:{'b' * 50_000} offloads nothing; known: q, k")
    assert len(str(long)) < 600 and str(long).endswith("offloads nothing; known: q, k")

"""How an error in the user's code is quoted: its whole message and cause, capped (jaxmem.errors.describe)."""
from jaxmem.errors import DESCRIBE_CHARS, DESCRIBE_LINES, describe


def raised(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError("did not raise")


def test_every_line_of_the_message_and_the_explicit_cause_are_kept():
    def inner():
        raise KeyError("vocab_size")

    def outer():
        try:
            inner()
        except KeyError as e:
            raise ValueError("the config is incomplete:\nsee configs/base.yaml") from e

    assert describe(raised(outer)) == ("ValueError: the config is incomplete:\nsee configs/base.yaml\n"
                                       "caused by: KeyError: 'vocab_size'")


def test_an_empty_message_is_the_type_alone():
    assert describe(RuntimeError()) == "RuntimeError"


def test_a_message_is_cut_at_the_line_limit_and_says_how_much_is_left():
    text = describe(ValueError("\n".join(f"row {i}" for i in range(100))))
    lines = text.splitlines()
    assert len(lines) == DESCRIBE_LINES + 1
    assert lines[0] == "ValueError: row 0" and lines[DESCRIBE_LINES - 1] == f"row {DESCRIBE_LINES - 1}"
    assert lines[-1].startswith(f"[message cut: {100 - DESCRIBE_LINES} more lines, ")


def test_one_huge_line_is_cut_at_the_character_limit():
    text = describe(ValueError("x" * 10_000))
    first, note = text.splitlines()
    assert len(first) == DESCRIBE_CHARS
    assert note == f"[message cut: {len('ValueError: ') + 10_000 - DESCRIBE_CHARS} more characters]"


def test_a_message_within_the_limits_is_unchanged():
    msg = "\n".join(f"row {i}" for i in range(DESCRIBE_LINES - 1))
    assert describe(TypeError(msg)) == f"TypeError: {msg}"


def test_a_frame_is_jaxmems_own_by_the_installed_package_not_by_jaxmem_in_its_path(tmp_path):
    import os

    from jaxmem import errors

    clone = tmp_path / "jaxmem" / "tests" / "fixtures" / "model.py"     # a user's file in a clone named jaxmem
    assert not errors.in_package(str(clone))
    assert errors.in_package(errors.__file__)
    assert errors.in_package(os.path.join(errors.PACKAGE_DIR, "compiler", "early_stop.py"))
    assert not errors.in_package(errors.PACKAGE_DIR + "_other/x.py")


# ---- where a model's or library's error was raised (errors.raised_at), through the CLI

import pathlib  # noqa: E402

from click.testing import CliRunner  # noqa: E402

from jaxmem.cli import main  # noqa: E402
from jaxmem.errors import raised_at  # noqa: E402

TRAINERS = pathlib.Path(__file__).resolve().parent / "fixtures" / "trainers"


def test_raised_at_names_the_innermost_frame_outside_jaxmem_and_the_frameworks():
    def library_layer():
        raise ValueError("num_heads")

    e = raised(library_layer)
    assert raised_at(e).endswith(f":{library_layer.__code__.co_firstlineno + 1} in library_layer")


def test_an_exit_2_from_a_library_names_the_librarys_file_and_line(monkeypatch):
    monkeypatch.delenv("JAXMEM_DEBUG", raising=False)
    r = CliRunner().invoke(main, ["analyze", str(TRAINERS / "lib_raises.py"), "--gpu", "h100", "--mesh", "fsdp=2"])
    assert r.exit_code == 2, r.output
    line = next(i for i, s in enumerate((TRAINERS / "layers_lib.py").read_text().splitlines(), 1) if "raise" in s)
    assert f"layers_lib.py:{line} in __call__" in r.output and "not divisible by num_heads=3" in r.output
    assert "Traceback" not in r.output


def test_jaxmem_debug_prints_the_whole_traceback_of_an_exit_2(monkeypatch):
    monkeypatch.setenv("JAXMEM_DEBUG", "1")
    r = CliRunner().invoke(main, ["analyze", str(TRAINERS / "lib_raises.py"), "--gpu", "h100", "--mesh", "fsdp=2"])
    assert r.exit_code == 2, r.output
    assert "Traceback (most recent call last)" in r.output and 'layers_lib.py", line' in r.output
    assert r.output.rstrip().splitlines()[-1].startswith("  raised at") or "error:" in r.output

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

"""The abstract train state (jaxmem.program.state): state an NNX model makes on its first call
(EasyDeL's cached RoPE table) is created by an init trace before the step is built."""
import json
import pathlib

from click.testing import CliRunner

from jaxmem.cli import main

TRAINERS = pathlib.Path(__file__).resolve().parent / "fixtures" / "trainers"


def test_state_made_on_the_first_call_is_created_by_an_init_trace_and_counted():
    r = CliRunner().invoke(main, ["analyze", str(TRAINERS / "first_call.py"), "--gpu", "h100", "--mesh", "fsdp=2",
                                  "--json", "--no-explain"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["breakdown"]["params"] == (64 * 64 + 64) * 4 // 2
    # the cached table (32 x 64 float32) is state, replicated, with the step's RNG key (8 bytes)
    assert d["breakdown"]["other_state"] == 32 * 64 * 4 + 8


def test_state_made_on_every_call_is_one_message_naming_the_leaf():
    from jaxmem.program.state import new_state_message

    before = {"rope": {}}
    after = {"rope": {"table": 1}}
    msg = new_state_message(before, after)
    assert "['rope']['table']" in msg and "__init__" in msg
    assert new_state_message(after, after) is None

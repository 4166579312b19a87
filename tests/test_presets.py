import dataclasses

import pytest

from jaxmem import choose_preset
from jaxmem.errors import UserError


@dataclasses.dataclass(frozen=True)
class Cfg:
    width: int = 8
    tied: bool = False
    remat: str = "none"


PRESETS = {"small": Cfg(), "big": Cfg(width=64)}


def test_overrides_and_bool_coercion():
    assert choose_preset("m", PRESETS, "big", {"tied": "true"}) == Cfg(width=64, tied=True)
    assert choose_preset("m", PRESETS, "small", {"tied": 0, "width": 3}) == Cfg(width=3)


@pytest.mark.parametrize("preset,overrides,message", [
    ("huge", {}, "unknown preset 'huge'; known presets: small, big"),
    ("small", {"depth": 2}, "unknown argument(s) depth; known: preset, seq, width, tied, remat"),
    ("small", {"remat": "sometimes"}, "remat='sometimes'"),
])
def test_mistakes_are_named(preset, overrides, message):
    with pytest.raises(UserError) as e:
        choose_preset("m", PRESETS, preset, overrides, extra_args=("seq",))
    assert message in str(e.value)

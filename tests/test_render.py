"""The text report's hints: what to change so it fits, only for the parts that make the peak."""
import dataclasses

import pytest
from helpers import golden_report

from jaxmem.present.render import hints
from jaxmem.report import BREAKDOWN_KEYS


@pytest.fixture(scope="module")
def report():
    return golden_report("mlp-data8-fsdp")   # a real report, loaded: the hints read only its fields


def _with(r, layout="fsdp", remat="none", **parts):
    """r with its breakdown made of `parts` (bytes; the other parts zero) and its peak their sum."""
    breakdown = {k: parts.get(k, 0) for k in BREAKDOWN_KEYS}
    return dataclasses.replace(r, breakdown=breakdown, per_device_peak_bytes=sum(breakdown.values()), layout=layout,
                               options={**r.options, "remat": remat})


def test_activations_suggest_the_remat_the_step_does_not_already_have(report):
    none = hints(_with(report, activations_and_temporaries=80, params=20))
    assert none[0] == ("activations_and_temporaries 80% of the peak: --remat full (or dots_saveable) with --remat-at "
                       "BLOCK if the model file takes no remat, a smaller --batch, or --accum N")
    placed = _with(report, remat="dots_saveable", activations_and_temporaries=80, params=20)
    placed = dataclasses.replace(placed, options={**placed.options, "remat_at": "^Block$"})   # it takes --remat-at
    assert hints(placed)[0] == ("activations_and_temporaries 80% of the peak: --remat full, a smaller --batch, "
                                "or --accum N")
    for remat in ("full", "nothing_saveable"):   # already saves nothing: remat is not the fix
        h = hints(_with(report, remat=remat, activations_and_temporaries=80, params=20))
        assert h[0] == "activations_and_temporaries 80% of the peak: a smaller --batch, or --accum N"


def test_a_part_under_a_tenth_of_the_peak_gets_no_hint(report):
    h = hints(_with(report, activations_and_temporaries=75, optimizer_state=16, params=9))
    assert [x.split(" ", 1)[0] for x in h] == ["activations_and_temporaries", "optimizer_state"]
    assert h[1] == "optimizer_state 16% of the peak: --optimizer adafactor or lion, or --precision bf16-pure"


def test_replicated_state_under_dp_points_at_fsdp(report):
    h = hints(_with(report, layout="dp", params=50, optimizer_state=50))
    assert all(x.endswith("replicated under dp: --layout fsdp shards params, gradients and optimizer state") for x in h)
    assert len(h) == 2

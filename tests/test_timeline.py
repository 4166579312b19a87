"""jaxmem.xla.timeline: XLA's memory curve replayed and downsampled."""

from jaxmem.xla import timeline


def test_downsampled_curve_keeps_the_peak():
    import numpy as np

    curve = np.arange(10_000) % 977
    curve[7777] = 10**9
    small = timeline.downsample(curve, 100)
    assert len(small) == 100 and max(small) == 10**9
    assert small[timeline.downsampled_index(7777, 10_000, 100)] == 10**9

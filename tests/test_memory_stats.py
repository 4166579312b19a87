"""XLA's memory numbers recomputed from a dumped buffer assignment equal memory_analysis()."""
import tempfile

import pytest

from conftest import build_step
from jaxmem.compiler import compiled
from jaxmem.xla import dump, memory_stats


def _built(models_dir, model: str, layout: str, **opts):
    return build_step(models_dir / model, mesh="data=8", layout=layout,
                      model_args={"preset": "tiny", "batch_size": 8}, **opts)[1]


def test_memory_numbers_from_the_dump_equal_xla_memory_analysis(models_dir):
    built = _built(models_dir, "llama.py", "fsdp")
    lowered, _ = compiled.lower(built)
    d = tempfile.mkdtemp()
    exe, stats = compiled._compile(lowered, {**dump.compile_options(d), **compiled.FAST_GPU_OPTIONS}, d, 0.0)
    m = memory_stats.from_hlo_proto(dump.read_dump_bytes(d))
    ma = exe.memory_analysis()
    assert m == {k: int(getattr(ma, f"{k}_size_in_bytes")) for k in memory_stats.NUMBERS}
    assert m["temp"] > 0 and m["alias"] > 0


def test_a_truncated_or_incomplete_dump_is_refused():
    with pytest.raises(ValueError):
        memory_stats.split_hlo_proto(b"")
    module = bytes([0x0A, 3]) + b"abc"            # field 1 (hlo_module) only: no buffer assignment
    with pytest.raises(ValueError, match="lacks"):
        memory_stats.split_hlo_proto(module)
    whole = module + bytes([0x1A, 2]) + b"xy"     # + field 3 (buffer_assignment)
    assert memory_stats.split_hlo_proto(whole) == (b"abc", b"xy")
    with pytest.raises(ValueError):
        memory_stats.split_hlo_proto(whole[:-1])

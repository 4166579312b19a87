"""The compile cache: a cached answer equals a fresh one; what changes the program misses."""
import json
import shutil

import pytest

from jaxmem.pipeline import AnalyzeOptions, analyze_file
from jaxmem.compiler import cache

MLP = "tests/fixtures/mlp_small.py"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("JAXMEM_CACHE", str(d))
    return d


def _json(report) -> str:
    return json.dumps(report.to_json(), indent=2)


def test_cache_dir_follows_xdg_and_the_override(monkeypatch, tmp_path):
    monkeypatch.delenv("JAXMEM_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "jaxmem"
    monkeypatch.setenv("JAXMEM_CACHE", str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine"


def test_a_cached_answer_equals_a_fresh_one_and_changes_miss(cache_dir, tmp_path):
    opts = AnalyzeOptions(gpu="h100", mesh="data=2", layout="fsdp", model_args=(("width", 64),))
    fresh = analyze_file(MLP, opts)
    assert fresh.timings["cache_hit"] == 0.0 and len(list(cache_dir.rglob("*.json.gz"))) == 1
    again = analyze_file(MLP, opts)
    assert again.timings["cache_hit"] == 1.0 and again.timings["compile_s"] == 0.0
    assert _json(again) == _json(fresh)                      # byte for byte, the explanation included
    # without the explanation: served by the same entry
    plain = analyze_file(MLP, AnalyzeOptions(**{**opts.__dict__, "explain": False}))
    assert plain.timings["cache_hit"] == 1.0 and plain.xla == fresh.xla
    # --no-cache compiles again, to the same answer
    nocache = analyze_file(MLP, AnalyzeOptions(**{**opts.__dict__, "cache": False}))
    assert nocache.timings["cache_hit"] == 0.0 and _json(nocache) == _json(fresh)

    # another option: a miss
    other = analyze_file(MLP, AnalyzeOptions(**{**opts.__dict__, "layout": "dp"}))
    assert other.timings["cache_hit"] == 0.0
    # a changed model file: a miss; a comment alone does not change the program
    changed = tmp_path / "mlp_small.py"
    shutil.copy(MLP, changed)
    text = changed.read_text()
    assert "nn.relu(" in text
    changed.write_text(text.replace("nn.relu(", "nn.gelu(", 1))
    assert analyze_file(str(changed), opts).timings["cache_hit"] == 0.0
    # a comment that moves every line: the same program, the same answer
    changed.write_text("# a comment\n\n" + changed.read_text())
    assert analyze_file(str(changed), opts).timings["cache_hit"] == 1.0


def test_an_unreadable_entry_is_a_miss(cache_dir):
    cache_dir.joinpath("compiles").mkdir(parents=True)
    bad = cache_dir / "compiles" / ("0" * 64 + ".json.gz")
    bad.write_bytes(b"not gzip")
    assert cache.load("0" * 64) is None
    cache.store("1" * 64, {"x": 1})
    assert cache.load("1" * 64) == {"x": 1}

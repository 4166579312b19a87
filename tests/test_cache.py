"""The compile cache: a cached answer equals a fresh one; what changes the program misses."""
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import MLP_SMALL as MLP  # noqa: E402

from jaxmem.compiler import cache
from jaxmem.pipeline import AnalyzeOptions, analyze_file


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
    # another memory limit for XLA (the run's pool: a memory fraction, or the platform allocator's 80% of the
    # card): a miss, though the lowered program is the same; the same limit again: a hit
    for seen, given in ((0.0, {"mem_fraction": 0.5}), (0.0, {"allocator": "platform"}), (1.0, {"mem_fraction": 0.5})):
        r = analyze_file(MLP, AnalyzeOptions(**{**opts.__dict__, **given}))
        assert r.timings["cache_hit"] == seen, given
        assert r.target.xla_memory_base_bytes != fresh.target.xla_memory_base_bytes
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


# -- an entry answers only for its own key, undamaged; anything else is a miss, never an error -----

import gzip  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402

from jaxmem.compiler.compiled import Artifacts, CompiledStats  # noqa: E402

K1, K2 = "1" * 64, "2" * 64


def _artifacts(temp: int) -> dict:
    stats = CompiledStats(argument=10, output=20, alias=5, temp=temp, generated_code=0, peak=0, host_temp=0,
                          lower_s=0.5, compile_s=1.5, notes=("n",))
    return Artifacts(stats=stats, cost={"flops": 2.0}, hlo_text="HloModule m", dump=b"\x00\x01dump").to_json()


def _load(k):
    return cache.load(k, parse=Artifacts.from_json)


def _entry(k):
    return cache._path(k)


def _rewrite(k, edit):
    """Decompress entry k, apply edit(header_bytes, body_bytes) -> bytes, recompress (as a person
    with an editor and gzip would)."""
    data = gzip.decompress(_entry(k).read_bytes())
    head, _, body = data.partition(b"\n")
    _entry(k).write_bytes(gzip.compress(edit(head, body)))


@pytest.fixture
def two_entries(cache_dir):
    cache.store(K1, _artifacts(1000))
    cache.store(K2, _artifacts(999_999))
    assert _load(K1).stats.temp == 1000 and _load(K2).stats.temp == 999_999
    return cache_dir


def test_swapped_entries_are_misses_not_each_others_answers(two_entries):
    a, b = _entry(K1).read_bytes(), _entry(K2).read_bytes()
    _entry(K1).write_bytes(b)
    _entry(K2).write_bytes(a)
    assert _load(K1) is None and _load(K2) is None
    # and the bad entries are gone: the fresh compile's store puts good ones there
    assert not _entry(K1).exists() and not _entry(K2).exists()


def test_an_entry_copied_under_another_key_is_a_miss(two_entries):
    _entry(K1).write_bytes(_entry(K2).read_bytes())
    assert _load(K1) is None and _load(K2).stats.temp == 999_999


def test_edited_numbers_are_a_miss_even_with_a_recomputed_sha256(two_entries):
    _rewrite(K1, lambda h, b: h + b"\n" + b.replace(b'"temp":1000', b'"temp":1001'))
    assert _load(K1) is None
    # a forger who recomputes a plain SHA-256 over header and payload does not know the secret
    cache.store(K1, _artifacts(1000))

    def forge(h, b):
        b = b.replace(b'"temp":1000', b'"temp":5')
        header = json.loads(h)
        header["size"] = len(b)
        header["digest"] = hashlib.sha256(json.dumps({k: v for k, v in header.items() if k != "digest"},
                                                     sort_keys=True).encode() + b"\n" + b).hexdigest()
        return json.dumps(header).encode() + b"\n" + b

    _rewrite(K1, forge)
    assert _load(K1) is None


def test_every_flipped_byte_is_a_miss_never_an_error(two_entries):
    good = _entry(K1).read_bytes()
    for i in range(len(good)):
        damaged = bytearray(good)
        damaged[i] ^= 0x20
        _entry(K1).write_bytes(bytes(damaged))
        out = _load(K1)
        # gzip's header has bytes no reader checks (flags, OS): the entry may still be whole
        assert out is None or out == Artifacts.from_json(_artifacts(1000)), i
    for cut in (0, 1, 10, len(good) // 2, len(good) - 1):
        _entry(K1).write_bytes(good[:cut])
        assert _load(K1) is None, cut


def test_a_payload_of_the_wrong_shape_is_a_miss(cache_dir):
    for bad in ({"x": 1}, {**_artifacts(1), "stats": {**_artifacts(1)["stats"], "temp": "lots"}},
                {**_artifacts(1), "stats": {**_artifacts(1)["stats"], "temp": -1}},
                {**_artifacts(1), "dump": "not base64!"}, {**_artifacts(1), "hlo_text": None},
                {**_artifacts(1), "stats": {**_artifacts(1)["stats"], "extra": 1}}):
        cache.store(K1, bad)   # signed by this cache: only its shape is wrong
        assert cache.load(K1) == bad and _load(K1) is None
        assert not _entry(K1).exists()


def test_entries_of_another_version_are_misses(two_entries, monkeypatch):
    real = cache._versions()
    monkeypatch.setattr(cache, "_versions", lambda: {**real, "jax": "0.0.1"})
    assert _load(K1) is None


def test_the_key_names_the_versions():
    import types

    import jax

    lowered = jax.jit(lambda x: x + 1).lower(1.0)
    built = types.SimpleNamespace(mesh=None)
    before = cache.keys(lowered, built, {}, explain=True)
    real = cache._versions

    try:
        cache._versions = lambda: {**real(), "jaxmem": "9.9"}
        assert cache.keys(lowered, built, {}, explain=True) != before
    finally:
        cache._versions = real


def _no_hang(seconds=5):
    def fail(*_):
        raise AssertionError("hung")
    signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)


def test_a_fifo_a_directory_or_a_symlink_is_a_miss_and_never_hangs(two_entries):
    os.unlink(_entry(K1))
    os.mkfifo(_entry(K1))
    _no_hang()
    try:
        assert _load(K1) is None
        assert not _entry(K1).exists()          # removed: the next store puts an entry there
        (_entry(K1) / "inside").mkdir(parents=True)
        assert _load(K1) is None and (_entry(K1) / "inside").is_dir()   # a directory's contents are not ours
        cache.store(K1, _artifacts(1000))       # cannot replace a directory: skipped, not an error
        os.rmdir(_entry(K1) / "inside")
        assert _load(K1) is None and not _entry(K1).exists()          # an empty one is removed
        os.symlink(_entry(K2), _entry(K1))
        assert _load(K1) is None
    finally:
        signal.alarm(0)


def test_without_its_secret_no_entry_answers(two_entries):
    (two_entries / "secret").write_bytes(b"x" * cache.SECRET_BYTES)
    assert _load(K2) is None
    cache.store(K2, _artifacts(7))              # stored under the secret now in place
    assert _load(K2).stats.temp == 7


def test_concurrent_writers_never_show_a_partial_entry(cache_dir):
    payloads = [{**_artifacts(t), "hlo_text": "x" * 200_000 + str(t)} for t in range(4)]
    expected = [Artifacts.from_json(p) for p in payloads]
    stop, seen, bad = threading.Event(), [], []

    def write(p):
        while not stop.is_set():
            cache.store(K1, p)

    def read():
        while not stop.is_set():
            out = _load(K1)
            if out is not None:
                (seen if out in expected else bad).append(out)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads] + [threading.Thread(target=read)]
    for t in threads:
        t.start()
    threading.Event().wait(3)
    stop.set()
    for t in threads:
        t.join()
    assert seen and not bad
    assert [n for n in os.listdir(cache_dir / "compiles") if n.startswith(".tmp-")] == []


def test_cache_info_and_clear(two_entries, tmp_path):
    (two_entries / "compiles" / ".tmp-123-abc").write_bytes(b"partial")
    (two_entries / "compiles" / "notes.txt").write_text("mine")
    d = cache.info()
    assert (d["path"], d["entries"], d["partial_writes"], d["other"]) == (str(two_entries), 2, 1, 1)
    assert d["bytes"] == sum(p.stat().st_size for p in (two_entries / "compiles").iterdir() if p.name != "notes.txt")
    from click.testing import CliRunner

    from jaxmem import cli

    r = CliRunner().invoke(cli.main, ["cache"])
    assert r.exit_code == 0 and f"{two_entries}: 2 entries" in r.stdout
    r = CliRunner().invoke(cli.main, ["cache", "--clear", "--json"])
    d = json.loads(r.stdout)
    assert r.exit_code == 0 and (d["removed"], d["entries"], d["partial_writes"]) == (3, 0, 0)
    assert (two_entries / "compiles" / "notes.txt").read_text() == "mine"


def test_a_damaged_entry_is_recompiled_to_the_same_answer_and_replaced(cache_dir):
    opts = AnalyzeOptions(gpu="h100", mesh="data=2", layout="fsdp", model_args=(("width", 48),))
    fresh = analyze_file(MLP, opts)
    (entry,) = cache_dir.rglob("*.json.gz")
    entry.write_bytes(entry.read_bytes()[:-7])
    again = analyze_file(MLP, opts)
    assert again.timings["cache_hit"] == 0.0 and _json(again) == _json(fresh)
    assert analyze_file(MLP, opts).timings["cache_hit"] == 1.0     # the fresh compile replaced it
    # --no-cache refreshes an entry too
    entry.write_bytes(b"garbage")
    nocache = analyze_file(MLP, AnalyzeOptions(**{**opts.__dict__, "cache": False}))
    assert _json(nocache) == _json(fresh) and analyze_file(MLP, opts).timings["cache_hit"] == 1.0


def test_swapped_entries_of_two_steps_give_each_its_own_answer(cache_dir):
    a = AnalyzeOptions(gpu="h100", mesh="data=2", layout="fsdp", model_args=(("width", 40),))
    b = AnalyzeOptions(**{**a.__dict__, "layout": "dp"})
    ra, rb = analyze_file(MLP, a), analyze_file(MLP, b)
    assert ra.per_device_peak_bytes != rb.per_device_peak_bytes
    ea, eb = sorted(cache_dir.rglob("*.json.gz"), key=lambda p: p.stat().st_mtime_ns)
    da, db = ea.read_bytes(), eb.read_bytes()
    ea.write_bytes(db)
    eb.write_bytes(da)
    assert _json(analyze_file(MLP, a)) == _json(ra) and _json(analyze_file(MLP, b)) == _json(rb)


# -- whose key: a key others could read or replace is never trusted silently (issue 25) ------------

from jaxmem.compiler import cache_key  # noqa: E402


@pytest.fixture
def own_config(tmp_path, monkeypatch):
    """This user's trust records in the test's own folder, and no warning remembered from before."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(cache_key, "_warned", set())
    return tmp_path / "config"


def test_the_key_is_readable_by_no_one_else(cache_dir, own_config):
    cache.store(K1, _artifacts(1000))
    assert os.stat(cache_dir / "secret").st_mode & 0o777 == 0o600
    info = cache.info()["key"]
    assert info["trusted"] and info["mode"] == "0600" and info["owner_uid"] == os.getuid()
    assert info["fingerprint"].startswith("sha256:") and len(info["fingerprint"]) == 39


def test_in_a_folder_shared_through_its_group_the_key_is_the_groups(cache_dir, own_config):
    cache_dir.mkdir()
    os.chmod(cache_dir, 0o2770)
    cache.store(K1, _artifacts(1000))
    assert os.stat(cache_dir / "secret").st_mode & 0o777 == 0o640
    assert _load(K1).stats.temp == 1000


def _forge(folder, k, temp):
    """An entry re-signed with the key now in `folder` (what its holder can do)."""
    import hmac

    secret = (folder / "secret").read_bytes()
    data = gzip.decompress(_entry(k).read_bytes())
    head, _, body = data.partition(b"\n")
    header = json.loads(head)
    d = json.loads(body)
    d["stats"]["temp"] = temp
    body = json.dumps(d, separators=(",", ":")).encode()
    header["size"] = len(body)
    h = json.dumps({x: v for x, v in header.items() if x != "digest"}, sort_keys=True).encode()
    header["digest"] = hmac.new(secret, h + b"\n" + body, hashlib.sha256).hexdigest()
    _entry(k).write_bytes(gzip.compress(json.dumps(header, sort_keys=True).encode() + b"\n" + body))


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another uid needs root")
def test_a_key_replaced_by_another_user_is_not_trusted_and_says_so(two_entries, own_config, capsys):
    # a user who can write the folder puts their own key there and signs an edited entry with it
    (two_entries / "secret").unlink()
    (two_entries / "secret").write_bytes(b"k" * 32)
    os.chmod(two_entries / "secret", 0o600)
    os.chown(two_entries / "secret", 4242, 4242)
    _forge(two_entries, K1, 10**15)
    assert _load(K1) is None and _load(K2) is None       # misses: the forged entry is never the answer
    assert _entry(K1).exists()                           # and nothing removed: not ours to judge
    cache.store(K2, _artifacts(7))                       # nothing signed with their key
    assert json.loads(gzip.decompress(_entry(K2).read_bytes()).partition(b"\n")[2])["stats"]["temp"] == 999_999
    err = capsys.readouterr().err
    assert err.count("warning: compile cache") == 1 and "owned by uid 4242, not by you" in err
    fp = cache.info()["key"]["fingerprint"]
    assert f"jaxmem cache --trust {fp}" in err
    # trusted on purpose (a team member's key): its entries answer
    cache.trust(fp)
    assert cache.info()["key"]["trusted"] and _load(K1).stats.temp == 10**15
    # and replaced once more: not the key trusted
    (two_entries / "secret").unlink()
    (two_entries / "secret").write_bytes(b"m" * 32)
    os.chmod(two_entries / "secret", 0o600)
    os.chown(two_entries / "secret", 4243, 4243)
    k = cache_key.inspect(two_entries)
    assert k.state == "replaced" and "not the key you trusted" in k.why and _load(K1) is None


def test_a_world_readable_key_of_ones_own_is_replaced(two_entries, own_config):
    os.chmod(two_entries / "secret", 0o644)               # as jaxmem before issue 25 made it
    old = (two_entries / "secret").read_bytes()
    assert cache_key.inspect(two_entries).state == "exposed" and _load(K1) is None
    cache.store(K1, _artifacts(5))
    assert (two_entries / "secret").read_bytes() != old and os.stat(two_entries / "secret").st_mode & 0o077 == 0
    assert _load(K1).stats.temp == 5


def test_trusting_a_fingerprint_that_is_not_the_keys_is_refused(two_entries, own_config):
    from jaxmem.errors import UserError

    with pytest.raises(UserError, match="has the fingerprint sha256:"):
        cache.trust("sha256:" + "0" * 32)


def test_read_only_mode_writes_nothing(cache_dir, own_config, monkeypatch):
    monkeypatch.setenv("JAXMEM_CACHE_READONLY", "1")
    cache.store(K1, _artifacts(1000))
    assert not cache_dir.exists()                         # no key made, no entry stored
    monkeypatch.delenv("JAXMEM_CACHE_READONLY")
    cache.store(K1, _artifacts(1000))
    _rewrite(K1, lambda h, b: h + b"\n" + b[:-3])         # damaged
    monkeypatch.setenv("JAXMEM_CACHE_READONLY", "1")
    assert _load(K1) is None and _entry(K1).exists()      # a miss, not removed by a reader
    assert cache.info()["key"]["read_only"]


def test_a_gzip_bomb_costs_the_cap_not_its_size():
    """A planted entry that inflates to 1 GiB: rejected after MAX_ENTRY_BYTES, and memory stays
    near that cap (it took 2.6 GB before)."""
    import subprocess
    import sys

    code = ("import gzip, resource, zlib\n"
            "from jaxmem.compiler import cache\n"
            "c = zlib.compressobj(1, zlib.DEFLATED, 31)\n"
            "block = bytes(1 << 24)\n"
            "bomb = b''.join([c.compress(block) for _ in range(64)] + [c.flush()])\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "assert cache._decompress(bomb) is None\n"
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    grew_mib = int(out.stdout)
    assert grew_mib < 600, grew_mib   # the 256 MiB cap and its buffer; a 1 GiB cap took 1 GiB and more


def test_a_large_constant_is_keyed_by_its_bytes_not_printed():
    def program(table):   # a step that closes over a table and reads rows the data picks (XLA keeps it whole)
        return jax.jit(lambda i: jnp.asarray(table)[i].sum()).lower(jax.ShapeDtypeStruct((4,), jnp.int32))

    table = np.arange(1 << 18, dtype=np.float32).reshape(-1, 64)   # 1 MiB: 2 MiB of hex if printed
    text = cache.program_text(program(table))
    assert len(text) < 64 << 10 and "dense_resource<__elided__>" in text
    assert cache.program_text(program(table.copy())) == text   # equal bytes, equal key
    changed = table.copy()
    changed[-1, -1] += 1
    assert cache.program_text(program(changed)) != text        # one element differs: another program
    small = np.arange(8, dtype=np.float32)   # below the limit: printed as it is, no digest
    assert "// constant sha256" not in cache.program_text(program(small))

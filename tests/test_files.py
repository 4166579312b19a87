"""jaxmem.files: every file a user names is read bounded and without blocking; every file jaxmem
writes goes beside its target and is renamed, never written through a link (issue 25)."""
import os
import time

import pytest

from jaxmem import files
from jaxmem.errors import UserError


def test_a_fifo_a_device_and_a_directory_are_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    t0 = time.monotonic()
    for path, kind in ((tmp_path / "fifo", "a FIFO"), ("/dev/zero", "a device"), (tmp_path, "a directory")):
        with pytest.raises(UserError, match=f"--rules {path}: is {kind}"):
            files.read_user_file(path, 1 << 20, "--rules", "give a rules file")
    assert time.monotonic() - t0 < 5


def test_at_most_the_cap_is_read(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(1 << 40)    # sparse: a terabyte that is never read
    with pytest.raises(UserError, match="more than the 1,024 jaxmem reads"):
        files.read_user_file(big, 1024, "--from", "fix")
    (tmp_path / "ok").write_bytes(b"x" * 1024)
    assert files.read_regular(tmp_path / "ok", 1024) == b"x" * 1024


def test_deep_nesting_and_huge_integers_are_user_errors():
    with pytest.raises(UserError, match="nested more than"):
        files.loads_json("[" * 100_000 + "]" * 100_000, "--rules r.json")
    with pytest.raises(UserError, match="nested more than 100"):
        files.loads_json("[" * 150 + "]" * 150, "--rules r.json")   # under Python's limit, over jaxmem's
    with pytest.raises(UserError, match="more than 4300 digits"):
        files.loads_json("[" + "1" * 5000 + "]", "--from p.json")
    with pytest.raises(ValueError):
        files.loads_json("not json", "x")   # the caller's own message (it may try YAML)


def test_a_deep_or_large_json_text_in_bytes_is_refused_as_a_str_is(monkeypatch):
    """loads_json reads the bounds of a UTF-8 text from its bytes (files.text_within_bounds) before any walk."""
    with pytest.raises(UserError, match="nested more than 100"):
        files.loads_json(b"[" * 150 + b"]" * 150, "--rules r.json")
    with pytest.raises(UserError, match="nested more than 100"):
        files.loads_json(b'{"a": ' * 101 + b"1" + b"}" * 101, "--rules r.json")
    files.loads_json(b"[" * 100 + b"]" * 100, "--rules r.json")   # 100 deep: within
    monkeypatch.setattr(files, "MAX_NODES", 1000)
    with pytest.raises(UserError, match="more than 1,000 values"):
        files.loads_json(("[" + ",".join(["1"] * 1000) + "]").encode(), "--from p.json")


def _random_json(r, depth):
    """A JSON value: nested lists and dicts, and strings of brackets, quotes, escapes and non-ASCII."""
    pick = r.random()
    if depth > 0 and pick < 0.35:
        return [_random_json(r, depth - 1) for _ in range(r.randint(0, 4))]
    if depth > 0 and pick < 0.7:
        return {r.choice(["a", "[", "}", 'q"', "\\", "é", "{[", ""]) + str(i): _random_json(r, depth - 1)
                for i in range(r.randint(0, 4))}
    return r.choice([1, -2, 3.5, None, True, "x", "]", "[[", "{", 'say "hi"', "back\\", "\u2603", "a,b:c", "",
                     '"]"', '"[["', '"{"'])


@pytest.mark.parametrize("max_depth,max_nodes", [(5, 10**6), (6, 10**6), (1, 10**6), (50, 25), (50, 60)])
def test_the_bounds_read_from_the_text_never_pass_a_document_the_walk_refuses(monkeypatch, max_depth, max_nodes):
    import json
    import random

    monkeypatch.setattr(files, "MAX_DEPTH", max_depth)
    monkeypatch.setattr(files, "MAX_NODES", max_nodes)
    r = random.Random(max_depth * 1000 + max_nodes)
    passed = refused = 0
    for _ in range(3000):
        doc = _random_json(r, r.randint(0, min(max_depth, 5) + 2))
        text = json.dumps(doc, ensure_ascii=r.random() < 0.5, indent=r.choice([None, 1])).encode()
        try:
            files.check_tree(doc, "doc", text_keys=True)
        except UserError:
            refused += 1
            assert not files.text_within_bounds(text), text   # the text must not pass what the walk refuses
        else:
            passed += files.text_within_bounds(text)
    assert passed > 300 and refused > 100, (passed, refused)   # both sides were tried


def test_the_text_bounds_count_a_dicts_keys_and_see_through_escaped_quotes(monkeypatch):
    import json

    monkeypatch.setattr(files, "MAX_NODES", 10)
    five = json.dumps(dict.fromkeys("abcde", 1)).encode()   # 1 + 5 keys + 5 values: one past 10
    assert not files.text_within_bounds(five)
    with pytest.raises(UserError, match="more than 10 values"):
        files.loads_json(five, "f.json")
    monkeypatch.setattr(files, "MAX_NODES", 10**6)
    monkeypatch.setattr(files, "MAX_DEPTH", 6)
    # seven lists deep, the innermost holding a value: the walk refuses it. The strings '"]"' and '"["' (their
    # quotes escaped) would read as brackets that make the text look six deep
    deep = json.dumps(['"]"', [[[[[["x"]]]]]], '"["']).encode()
    with pytest.raises(UserError, match="nested more than 6"):
        files.check_tree(json.loads(deep), "f.json")
    assert not files.text_within_bounds(deep)
    with pytest.raises(UserError, match="nested more than 6"):
        files.loads_json(deep, "f.json")


def test_an_alias_bomb_is_counted_as_expanded(monkeypatch):
    monkeypatch.setattr(files, "MAX_NODES", 10_000)
    layer: list = ["x"]
    for _ in range(20):       # 2**20 leaves once expanded, 20 lists in memory
        layer = [layer, layer]
    with pytest.raises(UserError, match="more than 10,000 values"):
        files.check_tree(layer, "--rules bomb.yaml")


def test_a_write_replaces_a_link_and_never_writes_through_it(tmp_path):
    important = tmp_path / "important.txt"
    important.write_text("keep me")
    link = tmp_path / "out.json"
    link.symlink_to(important)
    files.write_atomic(link, b"[]")
    assert important.read_text() == "keep me" and not link.is_symlink() and link.read_bytes() == b"[]"
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    def fails(fd):
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        files.write_atomic(tmp_path / "x", fails)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_folder_is_created_for_an_output_and_said(tmp_path):
    notes: list[str] = []
    files.write_output(tmp_path / "a" / "b" / "r.html", b"<html>", option="--html", on_note=notes.append)
    assert (tmp_path / "a" / "b" / "r.html").read_bytes() == b"<html>"
    assert notes == [f"--html {tmp_path / 'a' / 'b' / 'r.html'}: created the folder {tmp_path / 'a' / 'b'}"]

"""prepare's build key: an unchanged build is up to date and touches nothing; changing each
component in turn rebuilds and names it; --force, older datasets, standard input, the
stat shortcut and a damaged dataset."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys

import orjson
import pytest

from sftdata.errors import OutputExistsError
from sftdata.prepare import PrepareOptions, prepare
from sftdata.sources import Input, identity
from sftdata.store import build_key as bk
from sftdata.util.cache import write_entry
from sftdata.util.hashing import sha256_file
from tests.helpers.data import chat, write_jsonl
from tests.helpers.paths import FIXTURES, ROOT
from tests.helpers.processes import EndlessInput, wait_for

HOUR_NS = 3600 * 10**9


def snapshot(root) -> dict:
    """Every file's bytes and mtime, and every folder: what "touches nothing" is held to."""
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def src(tmp_path):
    return write_jsonl(tmp_path / "in.jsonl", [chat(f"question {i}", f"answer {i}") for i in range(8)])


def key_of(ds) -> str:
    return orjson.loads((ds / "dataset_metadata.json").read_bytes())["build"]["key"]


def test_an_unchanged_build_is_up_to_date_and_touches_nothing(tmp_path, src):
    first = prepare([src], tmp_path / "ds", PrepareOptions(val_split=0.25))
    before = snapshot(tmp_path / "ds")
    again = prepare([src], tmp_path / "ds", PrepareOptions(val_split=0.25, workers=2, memo_mb=0))
    assert again.up_to_date and again.changed == [] and again.build_key == first.build_key == key_of(tmp_path / "ds")
    assert snapshot(tmp_path / "ds") == before
    assert (again.records_read, again.episodes, again.tokens, again.trained_tokens, again.shards) == (
        first.records_read, first.episodes, first.tokens, first.trained_tokens, first.shards)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "in.jsonl"]  # no lock, no staging left


def test_the_metadata_records_the_key_its_components_the_identities_and_the_libraries(tmp_path, src):
    prepare([src], tmp_path / "ds", PrepareOptions())
    meta = orjson.loads((tmp_path / "ds" / "dataset_metadata.json").read_bytes())
    build = meta["build"]
    assert build["key"] == bk.build_key(build["components"]) and build["version"] == 1
    c = build["components"]
    assert c["inputs"] == [{"path": str(src), "sha256": sha256_file(src)}]
    assert c["options"] == meta["options"] and c["format_version"] == meta["format_version"] == 1
    assert c["code"] == bk.code_version() and c["tokenizer"]["file_sha256"] == meta["tokenizer"]["ranks_sha256"]
    st = os.stat(src)
    assert build["identities"] == [{"path": str(src), "identity": {
        "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino, "dev": st.st_dev}}]
    assert build["libraries"] == bk.library_versions()


def _rebuilt(tmp_path, src, opts=PrepareOptions(), **later) -> list[str]:
    """Prepare, apply ``later`` (what to change), prepare again: refused without --overwrite,
    rebuilt with it; the changes it named."""
    prepare([src], tmp_path / "ds", opts)
    old = key_of(tmp_path / "ds")
    change = later.get("change")
    if change:
        change()
    new_opts = later.get("opts_after", opts)
    with pytest.raises(OutputExistsError, match="already exists and is not up to date: "):
        prepare([src], tmp_path / "ds", new_opts)
    s = prepare([src], tmp_path / "ds", PrepareOptions(**{**new_opts.__dict__, "overwrite": True}))
    assert not s.up_to_date and s.build_key == key_of(tmp_path / "ds") != old
    assert prepare([src], tmp_path / "ds", new_opts).up_to_date  # and now it is
    return s.changed


def test_an_input_byte_rebuilds_and_names_the_input_with_both_hashes(tmp_path, src):
    a = sha256_file(src)

    def change():
        src.write_bytes(src.read_bytes().replace(b"answer 3", b"answer 4"))

    changed = _rebuilt(tmp_path, src, change=change)
    assert changed == [f"the input {src} changed (sha256 {a[:12]}... -> {sha256_file(src)[:12]}...)"]


def _ranks(path, merges=()) -> str:
    lines = [base64.b64encode(bytes([i])).decode() + f" {i}" for i in range(256)]
    lines += [base64.b64encode(m).decode() + f" {256 + k}" for k, m in enumerate(merges)]
    path.write_text("\n".join(lines) + "\n")
    return sha256_file(path)


def test_the_tokenizer_file_rebuilds_and_is_named_with_both_hashes(tmp_path, src):
    """(tiktoken keeps a copy of each file it reads by its path: the new ranks are the file's, not that copy)"""
    ranks = tmp_path / "tiny.tiktoken"
    a = _ranks(ranks)
    b = []
    changed = _rebuilt(tmp_path, src, PrepareOptions(tokenizer=str(ranks)),
                       change=lambda: b.append(_ranks(ranks, [b"an", b"sw"])))
    assert changed == [f"the tokenizer file changed (sha256 {a[:12]}... -> {b[0][:12]}...)"]
    assert orjson.loads((tmp_path / "ds" / "tokenizer_state.json").read_bytes())["ranks_sha256"] == b[0]


def test_an_option_rebuilds_and_is_named_as_its_flag(tmp_path, src):
    changed = _rebuilt(tmp_path, src, PrepareOptions(), opts_after=PrepareOptions(max_tokens=64))
    assert changed == ["the option --max-tokens changed (none -> 64)"]


def test_options_that_never_change_a_byte_are_not_in_the_key(tmp_path, src):
    prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    for other in (PrepareOptions(workers=2), PrepareOptions(memo_mb=0), PrepareOptions(memo_policy="lru"),
                  PrepareOptions(overwrite=True), PrepareOptions(wait=True)):
        assert prepare([src], tmp_path / "ds", other).up_to_date


def test_the_code_version_rebuilds_and_is_named(tmp_path, src, monkeypatch):
    old = bk.code_version()
    changed = _rebuilt(tmp_path, src, change=lambda: monkeypatch.setattr(bk, "code_version", lambda: "d" * 64))
    assert changed == [f"the rendering and masking code changed (source sha256 {old[:12]}... -> dddddddddddd...)"]


def test_the_format_version_rebuilds_and_is_named(tmp_path, src, monkeypatch):
    changed = _rebuilt(tmp_path, src, change=lambda: monkeypatch.setattr(bk, "format_version_for", lambda kind: 2))
    assert changed == ["the format version changed (1 -> 2)"]


def test_an_evaluation_file_is_part_of_the_key(tmp_path, src):
    evals = write_jsonl(tmp_path / "eval.jsonl", [{"prompt": "a b c d e f g h i j k l m n o p"}])
    a = sha256_file(evals)
    opts = PrepareOptions(decontaminate=(str(evals),))

    def change():
        write_jsonl(evals, [{"prompt": "q r s t u v w x y z a b c d e f"}])

    changed = _rebuilt(tmp_path, src, opts, change=change)
    assert changed == [f"the evaluation file {evals} changed (sha256 {a[:12]}... -> {sha256_file(evals)[:12]}...)"]


def test_force_rebuilds_an_up_to_date_target(tmp_path, src):
    prepare([src], tmp_path / "ds", PrepareOptions())
    s = prepare([src], tmp_path / "ds", PrepareOptions(force=True))
    assert not s.up_to_date and s.records_read == 8
    assert s.changed == ["--force rebuilds it whatever its build key says"]


def test_a_dataset_of_an_earlier_sftdata_has_no_key_and_is_treated_as_changed(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(FIXTURES / "six_markers_dataset", old)
    src = FIXTURES / "six_markers_dataset.jsonl"
    with pytest.raises(OutputExistsError, match=r"already exists and is not up to date: no build key recorded \(the "
                                                r"dataset was made by an earlier sftdata\)\. Pass --overwrite"):
        prepare([src], old, PrepareOptions())
    s = prepare([src], old, PrepareOptions(overwrite=True))
    assert s.changed == ["no build key recorded (the dataset was made by an earlier sftdata)"]
    assert prepare([src], old, PrepareOptions()).up_to_date


def test_a_dataset_missing_a_file_is_not_up_to_date(tmp_path, src):
    prepare([src], tmp_path / "ds", PrepareOptions())
    (tmp_path / "ds" / "train" / "shard_00000" / "mask.bin").unlink()
    with pytest.raises(OutputExistsError, match=r"not up to date: its files are not the ones its "
                                                r"dataset_metadata.json lists \(train/shard_00000/mask.bin is missing\)"):
        prepare([src], tmp_path / "ds", PrepareOptions())


class Hashes:
    """Counts the inputs read to know their sha256."""

    def __init__(self, monkeypatch):
        self.read = []
        real = identity.content_sha256
        monkeypatch.setattr(identity, "content_sha256", lambda inp: self.read.append(inp.name) or real(inp))


def test_an_input_whose_stat_is_unchanged_is_not_read_again(tmp_path, src, monkeypatch):
    monkeypatch.setattr(identity, "RACY_NS", 0)  # the file system's clock may not have moved since it was written
    hashes = Hashes(monkeypatch)
    prepare([src], tmp_path / "ds", PrepareOptions())
    assert hashes.read == []  # a new target: nothing to compare with, the inputs are read once, by the run
    assert prepare([src], tmp_path / "ds", PrepareOptions()).up_to_date and hashes.read == []
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns - HOUR_NS))  # touched: the same bytes, hashed again
    assert prepare([src], tmp_path / "ds", PrepareOptions()).up_to_date and hashes.read == [str(src)]
    before = snapshot(tmp_path / "ds")  # the dataset is not rewritten, and no cache stands for the new stat:
    assert prepare([src], tmp_path / "ds", PrepareOptions()).up_to_date and hashes.read == [str(src)] * 2
    assert snapshot(tmp_path / "ds") == before


def test_a_forged_input_hash_in_the_cache_does_not_make_a_changed_input_up_to_date(tmp_path, src, monkeypatch):
    """The entry an earlier sftdata kept of a touched input (its path and new stat -> the old
    sha256), forged for a changed one, in every form it took: the input is read, not trusted."""
    monkeypatch.setattr(identity, "RACY_NS", 0)
    prepare([src], tmp_path / "ds", PrepareOptions())
    old_sha = sha256_file(src)
    src.write_bytes(src.read_bytes().replace(b"a", b"b", 1))  # changed: same size, another byte
    looked = identity.look(Input(str(src), "file")).identity
    key = hashlib.sha256(orjson.dumps({"path": str(src.absolute()), "identity": looked},
                                      option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert write_entry("input-sha256", key, {"sha256": old_sha}, {}) is not None
    with pytest.raises(OutputExistsError, match=rf"already exists and is not up to date: the input "
                                                rf"{re.escape(str(src))} changed \(sha256 {old_sha[:12]}\.\.\. -> "
                                                rf"{sha256_file(src)[:12]}\.\.\.\)\. Pass --overwrite"):
        prepare([src], tmp_path / "ds", PrepareOptions())


def test_a_file_changed_just_before_its_build_is_hashed_again(tmp_path, src, monkeypatch):
    monkeypatch.setattr(identity, "RACY_NS", 10**18)  # every file "racily clean": its stat is never trusted
    hashes = Hashes(monkeypatch)
    prepare([src], tmp_path / "ds", PrepareOptions())
    assert prepare([src], tmp_path / "ds", PrepareOptions()).up_to_date and hashes.read == [str(src)]
    assert prepare([src], tmp_path / "ds", PrepareOptions()).up_to_date and hashes.read == [str(src)] * 2


def test_standard_input_is_never_up_to_date(tmp_path, src, monkeypatch):
    import io
    import sys

    def stdin():
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(src.read_bytes())))
        return ["-"]

    prepare(stdin(), tmp_path / "ds", PrepareOptions())
    meta = orjson.loads((tmp_path / "ds" / "dataset_metadata.json").read_bytes())
    assert meta["build"]["components"]["inputs"] == [{"path": "<stdin>", "sha256": sha256_file(src)}]
    note = ("standard input (-) is read anew on every run, so a dataset made from it is never up to date (its content "
            "is known only once it has been read)")
    with pytest.raises(OutputExistsError, match=r"not up to date: standard input \(-\) is read anew on every run"):
        prepare(stdin(), tmp_path / "ds", PrepareOptions())
    assert prepare(stdin(), tmp_path / "ds", PrepareOptions(overwrite=True)).changed == [note]


def test_an_up_to_date_rerun_sweeps_the_staging_folder_a_killed_run_left(tmp_path, src):
    """Issue 44.5, as written: a dataset, a run replacing it (--overwrite from standard input
    that never ends) SIGKILLed once it has written tokens, then the command that made the
    dataset again: up to date, nothing rebuilt, and the killed run's staging folder and lock
    file are gone (its owner is dead, its record proves it sftdata's); a folder of the same
    shape that is the user's stays."""
    target = tmp_path / "ds"
    prepare([src], target, PrepareOptions(val_split=0.25))
    before = snapshot(target)
    users = tmp_path / ".ds.tmp-2024-05"  # a name like a staging folder's, no owner record: the user's
    users.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "sftdata", "prepare-chat", "-", "-o", str(target), "--overwrite",
                          "-j", "1", "-q"], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    feed = EndlessInput(p, (orjson.dumps(chat("another question", "another answer")) + b"\n") * 2000)
    try:
        wait_for("the replacing run to write tokens", lambda: p.poll() is not None or any(
            t.stat().st_size for t in tmp_path.glob(".ds.tmp-*/*/shard_*/tokens.bin")))
        assert p.poll() is None
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        feed.close()
    left = sorted(x.name for x in tmp_path.iterdir() if x.name.startswith(".ds.tmp-") and x != users)
    assert len(left) == 1 and (tmp_path / ".ds.sftdata-lock").is_file()
    again = prepare([src], target, PrepareOptions(val_split=0.25))
    assert again.up_to_date and snapshot(target) == before
    assert sorted(x.name for x in tmp_path.iterdir()) == [".ds.tmp-2024-05", "ds", "in.jsonl"]

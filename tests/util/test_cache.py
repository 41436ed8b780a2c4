"""The user's cache of converted tokenizer tables: where it lives, entries that round-trip,
corrupt entries ignored and rebuilt, racing writers, an unwritable folder, and the
tokenizers that use it (the bundled cl100k_base, .tiktoken files, tokenizer.json)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest

from sftdata.chat.tokenizer import load_tokenizer
from sftdata.tokenize import ranks as tokenizer_mod
from sftdata.tokenize.ranks import arrays_to_ranks, ranks_to_arrays
from sftdata.util.cache import (
    CACHE_ENV,
    bypassed,
    cache_dir,
    cached,
    decode_entry,
    encode_entry,
    entry_path,
    read_entry,
    write_entry,
)
from sftdata.util.hashing import sha256_file
from tests.helpers.processes import SAFETY_S

KEY = "ab" * 32


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_where_the_cache_lives(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x"
    monkeypatch.setenv(CACHE_ENV, "off")
    assert cache_dir() is None and entry_path("k", KEY) is None and read_entry("k", KEY) is None
    assert write_entry("k", KEY, {}, {}) is None
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "sftdata"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "sftdata"


def test_an_entry_round_trips(here):
    ranks = {b"a": 0, b"\xff\x00": 7, b"hello": 3}
    arrays = {**ranks_to_arrays(ranks), "ids": np.array([5, 6], dtype=np.uint32)}
    path = write_entry("ranks", KEY, {"pat": "x", "n": 3}, arrays)
    assert path == here / f"ranks-v1-{KEY}.bin" and list(here.iterdir()) == [path]  # no temporary file left
    meta, back = read_entry("ranks", KEY)
    assert meta == {"pat": "x", "n": 3} and arrays_to_ranks(back) == ranks
    assert back["ids"].tolist() == [5, 6] and back["ids"].dtype == np.uint32
    with pytest.raises(ValueError, match="cache array f has dtype float64"):
        encode_entry({}, {"f": np.zeros(2)})


def test_a_corrupt_entry_is_ignored_and_rebuilt(here):
    calls = []

    def build():
        calls.append(1)
        return {"v": len(calls)}, {"x": np.arange(3, dtype=np.int64)}

    assert cached("k", KEY, build)[0] == {"v": 1}
    assert cached("k", KEY, build)[0] == {"v": 1} and len(calls) == 1  # from the cache
    path = entry_path("k", KEY)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the arrays
    path.write_bytes(bytes(data))
    assert read_entry("k", KEY) is None
    assert cached("k", KEY, build)[0] == {"v": 2} and len(calls) == 2  # rebuilt and rewritten
    assert read_entry("k", KEY)[0] == {"v": 2}
    for junk in (b"", b"SFTDATA-CACHE\x01", b"not a cache file at all" * 10, bytes(data[:40])):
        assert decode_entry(junk) is None


def test_an_unwritable_cache_only_costs_the_rebuild(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    assert write_entry("k", KEY, {}, {}) is None
    assert cached("k", KEY, lambda: ({"v": 1}, {}))[0] == {"v": 1}


def _race(folder: str, i: int) -> None:
    import os

    os.environ[CACHE_ENV] = folder
    for _ in range(20):
        write_entry("race", KEY, {"writer": i}, {"x": np.full(50_000, i, dtype=np.uint32)})


def test_two_processes_racing_leave_a_whole_entry(here):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_race, args=(str(here), i)) for i in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(SAFETY_S)
        assert p.exitcode == 0, f"a racing writer {'hangs' if p.exitcode is None else f'failed ({p.exitcode})'}"
    meta, arrays = read_entry("race", KEY)
    assert meta["writer"] in (1, 2) and set(arrays["x"].tolist()) == {meta["writer"]}
    assert [p.name for p in here.iterdir()] == [f"race-v1-{KEY}.bin"]


def test_the_bundled_tokenizer_starts_from_the_cache(here, monkeypatch):
    cold = load_tokenizer()
    (entry,) = here.iterdir()
    assert entry.name == "tiktoken-ranks-v1-223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7.bin"

    def no_parse():
        raise AssertionError("the ranks file was parsed again")

    monkeypatch.setattr(tokenizer_mod, "_bundled_cl100k", no_parse)
    warm = load_tokenizer()
    assert warm.ranks_sha256 == cold.ranks_sha256 == entry.name.split("-")[-1][:-4]
    assert warm.encode("Hello world, 日本語 😀") == cold.encode("Hello world, 日本語 😀")
    assert warm.special_tokens == cold.special_tokens and warm.state() == cold.state()


def test_a_tiktoken_file_is_cached_by_its_sha256(here, tmp_path):
    import base64

    ranks = {bytes([b]): b for b in range(256)}
    ranks[b"he"] = 256
    path = tmp_path / "tiny.tiktoken"
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    first = load_tokenizer(str(path))
    assert any(p.name.startswith("tiktoken-ranks-v1-") for p in here.iterdir())
    second = load_tokenizer(str(path))
    assert second.ranks_sha256 == first.ranks_sha256 == sha256_file(path)
    assert second.encode("hehe") == [256, 256]
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("not base64 !!\n")
    with pytest.raises(Exception, match="is not a valid .tiktoken ranks file"):
        load_tokenizer(str(bad))
    assert not any(sha256_file(bad) in p.name for p in here.iterdir())  # a failure is not cached


def _swap_ranks(path: Path, a: bytes, b: bytes) -> None:
    """Poison a ranks entry as a hostile writer of the cache folder can: two tokens' ranks
    swapped, the meta (its recorded ranks_sha256) kept, the entry sealed again."""
    meta, arrays = decode_entry(path.read_bytes())
    ranks = arrays_to_ranks(arrays)
    ranks[a], ranks[b] = ranks[b], ranks[a]
    path.write_bytes(encode_entry(meta, ranks_to_arrays(ranks)))


def test_a_poisoned_bundled_ranks_entry_is_rebuilt_from_the_bundled_file(here):
    text = "What is the capital of France?"
    cold = load_tokenizer()
    ids = cold.encode(text)
    (entry,) = here.iterdir()
    _swap_ranks(entry, b" capital", b" Paris")
    assert arrays_to_ranks(read_entry("tiktoken-ranks", entry.name.split("-")[-1][:-4])[1])[b" Paris"] == \
        cold.encode(" capital")[0]  # a whole entry, well sealed: only its source can tell
    warm = load_tokenizer()
    assert warm.encode(text) == ids and warm.decode(ids) == text and warm.state() == cold.state()
    assert arrays_to_ranks(decode_entry(entry.read_bytes())[1])[b" capital"] == ids[3]  # rebuilt, written again
    meta, arrays = decode_entry(entry.read_bytes())
    entry.write_bytes(encode_entry({**meta, "special_tokens": {"<|endoftext|>": 7}}, dict(arrays)))
    assert load_tokenizer().special_tokens == cold.special_tokens  # the meta is checked too


def test_a_poisoned_tiktoken_file_entry_is_parsed_again(here, tmp_path):
    import base64

    ranks = {bytes([b]): b for b in range(256)}
    ranks[b"he"], ranks[b"ll"] = 256, 257
    path = tmp_path / "tiny.tiktoken"
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    assert load_tokenizer(str(path)).encode("hell") == [256, 257]
    entry = here / f"tiktoken-ranks-v1-{sha256_file(path)}.bin"
    _swap_ranks(entry, b"he", b"ll")
    again = load_tokenizer(str(path))
    assert again.encode("hell") == [256, 257] and again.ranks_sha256 == sha256_file(path)
    crlf = tmp_path / "crlf.tiktoken"  # not the canonical text: parsed on every load, never taken from the cache
    crlf.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    assert [load_tokenizer(str(crlf)).encode("hell") for _ in range(2)] == [[256, 257]] * 2


@pytest.mark.parametrize("ranks", [{b"a": 0}, {b"ab": 3, b"\x00": 1, b"xyz": 2, b"\xff" * 7: 4_294_967_295},
                                   {bytes([b]) * n: 1000 * n + b for n in range(1, 5) for b in range(0, 256, 51)}])
def test_ranks_text_is_the_tiktoken_format(ranks):
    import base64

    want = b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in sorted(ranks.items(), key=lambda kv: kv[1]))
    assert tokenizer_mod.ranks_text(ranks_to_arrays(ranks)) == want


def test_bypassed_reads_and_writes_no_entry_here_or_in_a_worker(here):
    write_entry("k", KEY, {"v": 1}, {})
    with bypassed():
        assert read_entry("k", KEY) is None and write_entry("k", KEY, {"v": 2}, {}) is None
        assert cached("k", KEY, lambda: ({"v": 3}, {}))[0] == {"v": 3}
        assert cache_dir() == here  # the folder stays (object-storage datasets are read through it)
        with mp.get_context("spawn").Pool(1) as pool:
            assert pool.apply(read_entry, ("k", KEY)) is None
    assert read_entry("k", KEY)[0] == {"v": 1}  # untouched, and read again outside

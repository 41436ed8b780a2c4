"""Hostile and damaged inputs and configs: each is one line with the exit status a user
sees, never N bad records, a silently short dataset, an "internal error" or a traceback."""

from __future__ import annotations

import bz2
import codecs
import errno
import gzip
import io
import json
import lzma
import re
import sys
import tarfile
import types
import zipfile

import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import ConfigError, InputError
from sftdata.order.config import LoaderConfig
from sftdata.prepare import PrepareOptions, prepare
from sftdata.sources import inspect_source, refusal
from tests.helpers.data import chat, write_jsonl

runner = CliRunner()
RECORDS = [chat(f"question {i}", f"answer {i}") for i in range(40)]
JSONL = "".join(json.dumps(r) + "\n" for r in RECORDS).encode()


def run_prepare(tmp_path, src, *more):
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "-j", "1", "-q", *more])
    assert "Traceback" not in r.output
    return r.exit_code, r.output


def ok(tmp_path, src, name="ds"):
    s = prepare([src], tmp_path / name, PrepareOptions(workers=1))
    assert s.rejected == {}
    return s


# -- compression is sniffed, not trusted by name -------------------------------------------------
def test_a_five_byte_gz_is_a_truncated_file_not_an_empty_one(tmp_path):
    src = tmp_path / "data.jsonl.gz"
    src.write_bytes(gzip.compress(JSONL)[:5])
    assert run_prepare(tmp_path, src) == (1, f"error: {src} is a truncated or damaged gzip file (Compressed file ended "
                                             f"before the end-of-stream marker was reached): nothing could be read "
                                             f"from it; re-download or re-create it\n")
    assert not (tmp_path / "ds").exists()


def test_a_gz_that_ends_early_stops_the_run_naming_the_last_complete_line(tmp_path):
    src = tmp_path / "data.jsonl.gz"
    big = "".join(json.dumps(chat(f"question {i} " + "x" * (i % 13), f"answer {i}")) + "\n" for i in range(3000))
    blob = gzip.compress(big.encode(), compresslevel=1)
    src.write_bytes(blob[: len(blob) // 2])
    with gzip.open(io.BytesIO(blob[: len(blob) // 2])) as f:  # the lines a reader gets before the damage
        complete = 0
        try:
            for _ in f:
                complete += 1
        except EOFError:
            pass
    assert 0 < complete < 3000
    code, out = run_prepare(tmp_path, src)
    assert (code, out) == (1, f"error: {src} is a truncated or damaged gzip file (Compressed file ended before the "
                              f"end-of-stream marker was reached); the last complete line is line {complete}. Stopped "
                              f"rather than keep only the records before the damage: re-download or re-create the "
                              f"file\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl.gz"]


def test_a_truncated_gzip_json_array_is_an_error(tmp_path):
    src = tmp_path / "data.json.gz"
    blob = gzip.compress(json.dumps(RECORDS).encode())
    src.write_bytes(blob[:-10])  # the end-of-stream trailer is cut
    with pytest.raises(InputError) as e:
        prepare([src], tmp_path / "ds", PrepareOptions())
    # the array is streamed: the items before the damage are read (and the run stops there)
    assert str(e.value) == (f"{src} is a truncated or damaged gzip file (Compressed file ended before the "
                            f"end-of-stream marker was reached); 39 items of the JSON array could be read. Stopped "
                            f"rather than keep only the records before the damage: re-download or re-create the file")


def test_a_file_named_gz_that_is_not_gzip_is_read_as_what_it_is(tmp_path):
    plain = write_jsonl(tmp_path / "plain.jsonl", RECORDS)
    named_gz = tmp_path / "really_plain.jsonl.gz"
    named_gz.write_bytes(plain.read_bytes())
    gz_named_plain = tmp_path / "really_gzip.jsonl"
    gz_named_plain.write_bytes(gzip.compress(JSONL))
    a, b, c = ok(tmp_path, plain, "a"), ok(tmp_path, named_gz, "b"), ok(tmp_path, gz_named_plain, "c")
    assert a.episodes == b.episodes == c.episodes == {"train": 40}
    tokens = [(tmp_path / n / "train/shard_00000/tokens.bin").read_bytes() for n in "abc"]
    assert tokens[0] == tokens[1] == tokens[2]
    assert [inspect_source(p).compression for p in (plain, named_gz, gz_named_plain)] == [None, None, "gzip"]
    assert [inspect_source(p).compressed for p in (plain, named_gz, gz_named_plain)] == [False, False, True]


@pytest.mark.parametrize("kind, compress", [("bzip2", bz2.compress), ("xz", lzma.compress)])
def test_bzip2_and_xz_are_read_whatever_the_name(tmp_path, kind, compress):
    src = tmp_path / "data.bin"
    src.write_bytes(compress(JSONL))
    assert ok(tmp_path, src).episodes == {"train": 40}
    assert inspect_source(src).compression == kind


@pytest.mark.parametrize("kind, compress", [("bzip2", bz2.compress), ("xz", lzma.compress)])
def test_truncated_bzip2_and_xz_name_the_file(tmp_path, kind, compress):
    src = tmp_path / "data.bin"
    src.write_bytes(compress(JSONL)[:-8])
    with pytest.raises(InputError, match=rf"^{re.escape(str(src))} is a truncated or damaged {kind} file \(.+\); "):
        prepare([src], tmp_path / "ds", PrepareOptions())
    assert not (tmp_path / "ds").exists()


def test_zstd_without_the_module_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard raises ImportError
    src = tmp_path / "data.jsonl.zst"
    src.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 20)
    assert run_prepare(tmp_path, src) == (1, f"error: {src} is zstd-compressed; reading it needs the zstandard "
                                             f"module: pip install 'sftdata[zstd]' (or pip install zstandard, or "
                                             f"decompress it first: zstd -d {src})\n")


class _FakeZstd:
    """A stand-in for the zstandard module: a 'frame' is the magic, a 4-byte length and
    the bytes themselves; enough to test the reader's frame and truncation handling."""

    MAGIC = b"\x28\xb5\x2f\xfd"

    class ZstdError(Exception):
        pass

    class _Obj:
        def __init__(self):
            self.buf = b""
            self.eof = False
            self.unused_data = b""

        def decompress(self, data):
            self.buf += data
            if len(self.buf) < 8:
                return b""
            n = int.from_bytes(self.buf[4:8], "little")
            if len(self.buf) < 8 + n:
                return b""
            out, self.unused_data, self.eof = self.buf[8:8 + n], self.buf[8 + n:], True
            return out

    class ZstdDecompressor:
        def decompressobj(self):
            return _FakeZstd._Obj()

    @classmethod
    def frame(cls, data: bytes) -> bytes:
        return cls.MAGIC + len(data).to_bytes(4, "little") + data


def test_zstd_frames_are_read_and_a_cut_frame_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "zstandard", types.SimpleNamespace(
        ZstdDecompressor=_FakeZstd.ZstdDecompressor, ZstdError=_FakeZstd.ZstdError))
    half = len(JSONL) // 2
    cut = JSONL.rindex(b"\n", 0, half) + 1
    src = tmp_path / "data.zst"
    src.write_bytes(_FakeZstd.frame(JSONL[:cut]) + _FakeZstd.frame(JSONL[cut:]))  # two frames
    assert ok(tmp_path, src).episodes == {"train": 40}
    bad = tmp_path / "cut.zst"
    bad.write_bytes(_FakeZstd.frame(JSONL[:cut]) + _FakeZstd.frame(JSONL[cut:])[:-5])
    lines = JSONL[:cut].count(b"\n")
    with pytest.raises(InputError) as e:
        prepare([bad], tmp_path / "ds2", PrepareOptions(workers=1))
    assert str(e.value) == (f"{bad} is a truncated or damaged zstd file (the compressed data ends inside a zstd "
                            f"frame); the last complete line is line {lines}. Stopped rather than keep only the "
                            f"records before the damage: re-download or re-create the file")


# -- what is not JSON Lines is one line ----------------------------------------------------------
def _zip(path):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("chats.jsonl", JSONL)


def _tar_gz(path):
    with tarfile.open(path, "w:gz") as t:
        info = tarfile.TarInfo("chats.jsonl")
        info.size = len(JSONL)
        t.addfile(info, io.BytesIO(JSONL))


REFUSED = [
    ("chats.zip", _zip, "{f} is a zip archive; unpack it first"),
    ("chats.jsonl", _zip, "{f} is a zip archive; unpack it first"),
    ("chats.tar.gz", _tar_gz, "{f} is a tar archive (gzip-compressed); unpack it first"),
    ("data.parquet.gz", lambda p: p.write_bytes(gzip.compress(b"PAR1" + b"\x00" * 64 + b"PAR1")),
     "{f} is a Parquet file (gzip-compressed); decompress it first (Parquet is read in place, not as a stream)"),
    ("table.arrow", lambda p: p.write_bytes(b"ARROW1\x00\x00" + b"\x10" * 64),
     "{f} looks like an Arrow/Feather file, not JSON Lines; convert it to Parquet or JSON Lines first"),
    ("program.jsonl", lambda p: p.write_bytes(b"\x7fELF\x02\x01\x01" + b"\x00" * 200),
     "{f} looks like an executable (ELF), not JSON Lines; give the file of conversations"),
    ("table.jsonl", lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\x10" * 100),
     "{f} looks like an SQLite database, not JSON Lines; export the conversations as JSON Lines first"),
    ("twice.jsonl.gz", lambda p: p.write_bytes(gzip.compress(gzip.compress(JSONL))),
     "{f} is compressed twice (gzip, then gzip); decompress it once and give the result"),
    ("blob.jsonl", lambda p: p.write_bytes(b'{"messages": [' + b"\x00\x01\x02" * 50),
     "{f} is a binary file, not JSON Lines or a JSON array (a NUL byte at offset 14); give the conversations as "
     "text, one JSON object per line"),
    ("blob.jsonl.gz", lambda p: p.write_bytes(gzip.compress(bytes(range(1, 9)) * 50)),
     "{f} is a binary file (gzip-compressed), not JSON Lines or a JSON array (400 control bytes in its first 400); "
     "give the conversations as text, one JSON object per line"),
    ("utf16.jsonl", lambda p: p.write_bytes(JSONL.decode().encode("utf-16-le")),
     "{f} looks like UTF-16 text (little-endian) without a byte order mark; re-encode it as UTF-8 (iconv -f UTF-16LE "
     "-t UTF-8)"),
    ("utf16be.jsonl", lambda p: p.write_bytes(JSONL.decode().encode("utf-16-be")),
     "{f} looks like UTF-16 text (big-endian) without a byte order mark; re-encode it as UTF-8 (iconv -f UTF-16BE "
     "-t UTF-8)"),
]


@pytest.mark.parametrize("name, make, message", REFUSED, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSED)])
def test_what_is_not_json_lines_is_refused_in_one_line(tmp_path, name, make, message):
    src = tmp_path / name
    make(src)
    assert run_prepare(tmp_path, src) == (1, "error: " + message.format(f=src) + "\n")
    assert not (tmp_path / "ds").exists()


def test_a_text_file_with_a_stray_control_byte_is_still_read_record_by_record(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"messages": \x01}\n' + JSONL)
    s = prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    assert s.rejected == {"invalid_json": 1} and s.episodes == {"train": 40}


def test_refusal_is_a_pure_function_of_the_first_bytes():
    assert refusal(JSONL[:4096], "x") is None
    assert refusal(b"", "x") is None  # an empty file is "no records", said later
    assert refusal(b"[\n" + JSONL[:100], "x") is None
    assert refusal(codecs.BOM_UTF16_LE + "[]".encode("utf-16-le"), "x") is None  # UTF-16 with a BOM: read


# -- UTF-16 / UTF-32 with a byte order mark are decoded -----------------------------------------
@pytest.mark.parametrize("codec, container", [("utf-16", "jsonl"), ("utf-16-be-bom", "jsonl"),
                                              ("utf-32", "json"), ("utf-8-sig", "json")])
def test_unicode_byte_order_marks_are_decoded_to_the_same_dataset(tmp_path, codec, container):
    text = JSONL.decode() if container == "jsonl" else json.dumps(RECORDS, ensure_ascii=False)
    text = text.replace("answer 3", "answer 3 — ünïcödé ✓ 𝄞")
    data = (codecs.BOM_UTF16_BE + text.encode("utf-16-be")) if codec == "utf-16-be-bom" else text.encode(codec)
    src = tmp_path / f"in.{container}"
    src.write_bytes(data)
    ref = tmp_path / f"ref.{container}"
    ref.write_bytes(text.encode())
    assert inspect_source(src).container == container
    ok(tmp_path, src, "a")
    ok(tmp_path, ref, "b")
    assert (tmp_path / "a/train/shard_00000/tokens.bin").read_bytes() == \
        (tmp_path / "b/train/shard_00000/tokens.bin").read_bytes()


def test_invalid_utf16_names_the_file_and_the_byte(tmp_path):
    src = tmp_path / "in.jsonl"
    good = "".join(json.dumps(r) + "\n" for r in RECORDS[:3]).encode("utf-16-le")
    src.write_bytes(codecs.BOM_UTF16_LE + good + b"\x00\xd8" + b"{\x00}\x00\n\x00")  # a lone high surrogate
    with pytest.raises(InputError) as e:
        prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    at = 2 + len(good)  # the byte order mark, then the good lines
    assert str(e.value) == (f"{src} is not valid UTF-16 text (illegal UTF-16 surrogate at byte {at:,}); "
                            f"re-encode the file as UTF-8")


def test_an_empty_gzip_holds_no_records(tmp_path):
    src = tmp_path / "empty.jsonl.gz"
    src.write_bytes(gzip.compress(b""))
    assert run_prepare(tmp_path, src) == (1, f"error: no records in {src} (an empty file, only blank lines, or []); "
                                             f"nothing to write. Give JSONL (one conversation per line) or a JSON "
                                             f"array of conversations\n")


# -- every record rejected, a full disk: what the CLI says ---------------------------------------
def test_cli_every_record_rejected_names_where_the_reasons_are(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"conversations": [{"from": "system", "value": "Be brief."}]},
                                             {"messages": [{"role": "user", "content": "u"},
                                                           {"role": "assistant", "content": None}]}])
    assert run_prepare(tmp_path, src) == (
        1, f"error: every record was rejected (2 read; no_assistant_turn: 1, empty_assistant_turn: 1); nothing was "
           f"written to {tmp_path / 'ds'}. The reason for each record is in {tmp_path / 'ds.rejects.jsonl'}\n")
    rejects = [json.loads(x) for x in (tmp_path / "ds.rejects.jsonl").read_text().splitlines()][:-1]  # the seal
    assert [(r["reason"], r["message"]) for r in rejects] == [
        ("no_assistant_turn", "the record holds only a system message (no user or assistant message), so nothing "
                              "would be trained"),
        ("empty_assistant_turn", "every assistant message is empty (null or blank content), so nothing would be "
                                 "trained")]
    assert not (tmp_path / "ds").exists()


def test_cli_a_full_disk_names_the_path(tmp_path, monkeypatch):
    from sftdata.store import split_writer

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(split_writer._HashedFile, "write", full)
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS[:3])
    code, out = run_prepare(tmp_path, src)
    assert code == 1
    # no --val-split: the episodes go straight to train/, the folder being written
    assert re.fullmatch(rf"error: {re.escape(str(tmp_path))}/\.ds\.tmp-\d+-[0-9a-f]{{8}}/train: No space left on "
                        rf"device \(while preparing {re.escape(str(tmp_path / 'ds'))}\); the disk is full: free some "
                        rf"space, or choose another path\n", out), out


# -- configs are parsed as hostile input ----------------------------------------------------------
LAUGHS = """<?xml version="1.0" encoding="UTF-16"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
]>
<training><dataset_mode>&lol2;</dataset_mode></training>
"""


REFUSED_ALL = "line 2: <!DOCTYPE ...> declarations are not allowed in config files (entities are never expanded); " \
              "remove it"


@pytest.mark.parametrize("codec, declared, message", [
    ("utf-16", "UTF-16", REFUSED_ALL),
    ("utf-8", "UTF-8", REFUSED_ALL),
    ("utf-8-sig", "UTF-8", REFUSED_ALL),
    ("utf-16-le", "UTF-16LE", REFUSED_ALL),
    ("utf-16-be", "UTF-16BE", REFUSED_ALL),
    ("utf-16-le", "UTF-16-LE", "the XML cannot be read (multi-byte encodings are not supported); save it as UTF-8"),
    ("utf-32", "UTF-32", "invalid XML (not well-formed (invalid token): line 1, column 1)"),
])
def test_xml_entities_are_never_expanded_whatever_the_encoding(tmp_path, codec, declared, message):
    p = tmp_path / "lol.xml"
    p.write_bytes(LAUGHS.replace('encoding="UTF-16"', f'encoding="{declared}"').encode(codec))
    with pytest.raises(ConfigError) as e:
        LoaderConfig.from_file(p)
    assert str(e.value) == f"{p}: {message}"


def test_a_utf16_xml_config_without_declarations_is_read(tmp_path):
    p = tmp_path / "t.cfg"  # no .xml suffix: the byte order mark and "<" say what it is
    p.write_bytes('<?xml version="1.0" encoding="UTF-16"?><training><batch_size>3</batch_size></training>'
                  .encode("utf-16"))
    assert LoaderConfig.from_file(p).batch_size == 3


def test_xml_external_entity_is_refused(tmp_path):
    p = tmp_path / "xxe.xml"
    p.write_text('<?xml version="1.0"?>\n<!DOCTYPE t [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>\n'
                 '<training><dataset_mode>&xxe;</dataset_mode></training>')
    with pytest.raises(ConfigError, match=r"^.*xxe.xml: line 2: <!DOCTYPE \.\.\.> declarations are not allowed"):
        LoaderConfig.from_file(p)


def _deep(n: int) -> str:
    return '{"a": ' * n + "1" + "}" * n


@pytest.mark.parametrize("body, message", [
    (_deep(100_000), "the JSON is nested deeper than 64 levels; a config is an object of settings"),
    (_deep(65), "the JSON is nested deeper than 64 levels; a config is an object of settings"),
    ('{"batch_size": ' + "9" * 100_000 + "}", "an integer of 100,000 digits (at most 30 are accepted)"),
    ('{"n": ' + "1" * 31 + "}", "an integer of 31 digits (at most 30 are accepted)"),
    ('{"lr": 1e999}', "1e999 is infinite or beyond the range of a float; give a finite number"),
    ('{"lr": NaN}', "NaN is not a number JSON allows; give a finite number"),
    ('{"lr": -Infinity}', "-Infinity is not a number JSON allows; give a finite number"),
])
def test_json_config_pathologies_are_config_errors_naming_the_file(tmp_path, body, message):
    p = tmp_path / "c.json"
    p.write_text(body)
    with pytest.raises(ConfigError) as e:
        LoaderConfig.from_file(p)
    assert str(e.value) == f"{p}: {message}"


def test_json_config_limits_are_inclusive(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"batch_size": 4, "model": ' + _deep(63) + ', "seed_long": ' + "7" * 30 + "}")
    c = LoaderConfig.from_file(p)
    assert c.batch_size == 4 and c.extra["seed_long"] == int("7" * 30)


def test_json_config_in_utf8_with_bom_is_read_and_other_bytes_are_refused(tmp_path):
    p = tmp_path / "c.json"
    p.write_bytes(codecs.BOM_UTF8 + b'{"batch_size": 5}')
    assert LoaderConfig.from_file(p).batch_size == 5
    p.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(ConfigError) as e:
        LoaderConfig.from_file(p)
    assert str(e.value) == f"config file {p} is not UTF-8 text (byte 13); save it as UTF-8"


def test_a_huge_config_file_is_refused_before_reading(tmp_path):
    p = tmp_path / "c.json"
    with open(p, "wb") as f:
        f.truncate((16 << 20) + 1)  # sparse: nothing is written
    with pytest.raises(ConfigError) as e:
        LoaderConfig.from_file(p)
    assert str(e.value) == (f"config file {p} is 16,777,217 bytes; a config holds settings, at most 16,777,216 "
                            f"bytes: give the right file")


@pytest.mark.parametrize("body, message", [
    ("<batch_size>" + "9" * 100_000 + "</batch_size>", "<batch_size> holds 100,000 characters; an integer here has "
                                                         "at most 30 digits"),
    ("<learning_rate>nan</learning_rate>", "<learning_rate>: nan is not a number; give a finite number"),
    ("<learning_rate>1e999</learning_rate>", "<learning_rate>: 1e999 is infinite or beyond the range of a float; "
                                             "give a finite number"),
    ("<learning_rate>" + "1" * 500 + "</learning_rate>", "<learning_rate> holds 500 characters, not a number"),
])
def test_xml_config_numbers_are_bounded(tmp_path, body, message):
    p = tmp_path / "t.xml"
    p.write_text(f"<training>{body}</training>")
    with pytest.raises(ConfigError) as e:
        LoaderConfig.from_file(p, extra_keys={"learning_rate": float})
    assert str(e.value) == f"{p}: {message}"


def test_cli_a_pathological_config_is_a_config_error_not_an_internal_error(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS[:4])
    prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    cfg = tmp_path / "deep.json"
    cfg.write_text(_deep(100_000))
    r = runner.invoke(app, ["replay-order", str(tmp_path / "ds"), "--config", str(cfg), "--step", "0"])
    assert (r.exit_code, r.output) == (1, f"error: {cfg}: the JSON is nested deeper than 64 levels; a config is an "
                                          f"object of settings\n")
    cfg.write_text('{"epoch_seed": ' + "1" * 100_000 + "}")
    r = runner.invoke(app, ["replay-order", str(tmp_path / "ds"), "--config", str(cfg), "--step", "0"])
    assert (r.exit_code, r.output) == (1, f"error: {cfg}: an integer of 100,000 digits (at most 30 are accepted)\n")

"""Hostile tokenizer folders through prepare: too large or backtracking is one error line;
a record the tokenizers library panics on is rejected as tokenizer_error, the same with
workers (the panic comes back from a worker as a picklable error), and Rust's report of the
panic never reaches the terminal."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is not installed")

from sftdata.cli import app  # noqa: E402
from tests.helpers.data import chat, write_jsonl  # noqa: E402
from tests.helpers.hostile_tokenizers import big_tokenizer, split_tokenizer  # noqa: E402

runner = CliRunner()
RECORDS = [chat("hello", "world"), chat("a" * 40 + "b", "fine"), chat("how are you", "well")]


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output
    return r


def files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_record_the_library_panics_on_is_rejected_with_workers_too(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("RUST_BACKTRACE", "1")
    tok = split_tokenizer(tmp_path / "tok", r"(a|a)+$")
    src = write_jsonl(tmp_path / "chats.jsonl", RECORDS * 2)
    for workers in (1, 2):
        r = run("prepare-chat", src, "-o", tmp_path / f"ds{workers}", "--tokenizer", tok, "--chat-template", "llama3",
                "-j", workers, "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["rejected"] == {"tokenizer_error": 2}
    assert files(tmp_path / "ds1") == files(tmp_path / "ds2")
    rejects = [json.loads(line) for line in (tmp_path / "ds2" / "rejects.jsonl").read_text().splitlines()]
    assert [(x["where"], x["reason"], x["message"]) for x in rejects] == [
        (f"{src}:line {n}", "tokenizer_error",
         f"the tokenizers library panicked encoding a rendered text with {tok / 'tokenizer.json'}: Onig: Regex "
         f"search error: retry-limit-in-match over") for n in (2, 5)]
    assert "panicked at" not in capfd.readouterr().err  # Rust's report of the panics (hundreds of lines) is gone


def test_strict_names_the_record_and_the_file_in_one_line(tmp_path, capfd):
    tok = split_tokenizer(tmp_path / "tok", r"(a|a)+$")
    src = write_jsonl(tmp_path / "chats.jsonl", RECORDS)
    r = run("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", tok, "--chat-template", "llama3", "-j", "1",
            "--strict")
    assert r.exit_code == 1
    assert r.output == (f"error: {src}:line 2: the tokenizers library panicked encoding a rendered text with "
                        f"{tok / 'tokenizer.json'}: Onig: Regex search error: retry-limit-in-match over (--strict "
                        f"stops at the first bad record; drop --strict to skip and count bad records)\n")
    assert capfd.readouterr().err == ""


def test_a_backtracking_regex_or_an_oversized_file_is_one_line(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "chats.jsonl", RECORDS)
    tok = split_tokenizer(tmp_path / "tok", r"(\w+\s?)+$")
    r = run("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", tok, "--chat-template", "llama3")
    assert r.exit_code == 1 and r.output.count("\n") == 1
    assert r.output.startswith(f"error: {tok / 'tokenizer.json'}: the regular expression '(\\\\w+\\\\s?)+$' at "
                               f"tokenizer.json.pre_tokenizer.pretokenizers[0].pattern repeats a group")
    big = big_tokenizer(tmp_path / "big", merges=3_000)
    monkeypatch.setenv("SFTDATA_MAX_TOKENIZER_MERGES", "2500")
    r = run("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", big, "--chat-template", "llama3")
    assert r.exit_code == 1 and re.fullmatch(
        rf"error: {re.escape(str(big / 'tokenizer.json'))} has 3,000 merges, more than the 2,500 a tokenizer may "
        rf"have \(real ones have up to about 500,000\); if you trust it, raise the limit: "
        rf"SFTDATA_MAX_TOKENIZER_MERGES=3000\n", r.output)
    monkeypatch.setenv("SFTDATA_MAX_TOKENIZER_MB", "0.05")
    r = run("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", big, "--chat-template", "llama3")
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "a tokenizer file may be" in r.output
    assert not (tmp_path / "ds").exists()

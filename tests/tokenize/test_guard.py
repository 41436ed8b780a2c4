"""A model folder's tokenizer files are untrusted: too large, too many merges or a regex that
backtracks is refused before the tokenizers library reads it; whatever the library raises or
panics with becomes one TokenizerFailure naming the file (picklable, for workers), and Rust's
report of a panic never reaches standard error."""

from __future__ import annotations

import base64
import json
import os
import pickle
import re

import pytest

pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is not installed")

from sftdata.errors import TokenizerError, TokenizerFailure, UsageError  # noqa: E402
from sftdata.tokenize.guard import (  # noqa: E402
    backtracking,
    is_panic,
    normalizer_expansion,
    present,
    read_limited,
)
from sftdata.tokenize.open import load_hf_tokenizer  # noqa: E402
from tests.helpers.hostile_tokenizers import big_tokenizer, split_tokenizer  # noqa: E402

# the split patterns of real tokenizer.json files: none is refused
REAL = {
    "GPT-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "Llama 3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+",
    "Qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
             r"\s+(?!\S)|\s+",
    "o200k": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
             r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
             r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "DeepSeek V3": r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+"
                   r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "digits": r"\p{N}", "a group once": r"(a+)?b", "atomic": r"(?>a+)+b", "possessive": r"(a++)+b",
    "a class": r"[(a+)+]+", "escaped parentheses": r"\(a+\)+", "alternation": r"(?:ab|cd)+",
    "bounded inside": r"(?:\r?\n)+", "a literal brace": r"a{x}+",
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_the_patterns_of_real_tokenizers_pass(name):
    assert backtracking(REAL[name]) is None


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(a*)*b", r"(?:\s*x)*y", r"(\w+\s?){2,}$", r"((ab)+c)+d",
                                     r"(a+){2}", r"(?i:(?:a|b+)c)+", r"(x(?=y+)z+)*", r"(\p{L}+\s)*!"])
def test_a_group_repeated_around_a_repetition_is_found(pattern):
    assert backtracking(pattern) == "repeats a group that itself repeats without bound"


def test_a_backtracking_regex_is_refused_at_load(tmp_path):
    folder = split_tokenizer(tmp_path / "tok", r"(a+)+$")
    with pytest.raises(TokenizerError, match=re.escape(
            f"{folder / 'tokenizer.json'}: the regular expression '(a+)+$' at "
            f"tokenizer.json.pre_tokenizer.pretokenizers[0].pattern repeats a group that itself repeats without "
            f"bound, so one long text could take the tokenizers library minutes (catastrophic backtracking); a "
            f"tokenizer with it is refused") + "$"):
        load_hf_tokenizer(folder)


@pytest.mark.parametrize("engine", ["auto", "hf"])
def test_a_panic_of_the_library_is_one_picklable_error_and_rust_says_nothing(tmp_path, capfd, monkeypatch, engine):
    monkeypatch.setenv("RUST_BACKTRACE", "1")  # the longest report Rust can print
    tok = load_hf_tokenizer(split_tokenizer(tmp_path / "tok", r"(a|a)+$"), engine=engine)  # passes the check
    assert tok.encode_rendered("hello world").ids.size > 0
    message = (f"the tokenizers library panicked encoding a rendered text with {tok.path}: Onig: Regex search "
               f"error: retry-limit-in-match over")
    with pytest.raises(TokenizerFailure, match=re.escape(message) + "$") as e:
        tok.encode_rendered("a" * 40 + "b")
    assert e.value.reason == "tokenizer_error"
    assert str(pickle.loads(pickle.dumps(e.value))) == message  # a worker can send it back
    with pytest.raises(TokenizerFailure, match=r"panicked encoding a rendered text with "):
        tok.encode_rendered_many(["hello", "a" * 40 + "b"])
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert tok.encode_rendered("hello world").ids.size > 0  # the tokenizer still works


def test_what_others_write_to_stderr_during_a_call_is_passed_on(tmp_path, capfd):
    import os

    from sftdata.tokenize.guard import library_call

    class Writer:
        path = "t.json"

        @library_call("writing")
        def write(self):
            os.write(2, b"a warning from the library\n")
            return 1

    assert Writer().write() == 1
    assert capfd.readouterr().err == "a warning from the library\n"


def test_is_panic_knows_a_panic_by_its_type_only():
    panic = type("PanicException", (BaseException,), {"__module__": "pyo3_runtime"})
    assert is_panic(panic("x")) and not is_panic(KeyboardInterrupt()) and not is_panic(SystemExit())
    assert not is_panic(type("PanicException", (BaseException,), {"__module__": "mine"})())


def test_a_file_larger_than_the_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    folder = big_tokenizer(tmp_path / "big", merges=2_000)
    size = (folder / "tokenizer.json").stat().st_size
    monkeypatch.setenv("SFTDATA_MAX_TOKENIZER_MB", "0.01")
    with pytest.raises(TokenizerError, match=re.escape(
            f"{folder / 'tokenizer.json'} is {size / (1 << 20):,.1f} MiB, more than the 0.0 MiB a tokenizer file "
            f"may be (real ones are at most about 33 MB); if you trust it, raise the limit: "
            f"SFTDATA_MAX_TOKENIZER_MB=1") + "$"):
        load_hf_tokenizer(folder)
    monkeypatch.setenv("SFTDATA_MAX_TOKENIZER_MB", "1")
    assert load_hf_tokenizer(folder).vocab_size == 256 + 2_000 + 5
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "x" * (1 << 20)}))
    with pytest.raises(TokenizerError, match=re.escape(f"{folder / 'tokenizer_config.json'} is 1.0 MiB, more than "
                                                       f"the 1.0 MiB a tokenizer file may be")):
        load_hf_tokenizer(folder)
    monkeypatch.setenv("SFTDATA_MAX_TOKENIZER_MB", "lots")
    with pytest.raises(UsageError, match=r"^SFTDATA_MAX_TOKENIZER_MB must be a positive number \(MiB\), got 'lots'$"):
        load_hf_tokenizer(folder)


def test_too_many_merges_are_refused_before_the_library_loads_them(tmp_path, monkeypatch):
    folder = big_tokenizer(tmp_path / "big", merges=2_000)
    monkeypatch.setenv("SFTDATA_MAX_TOKENIZER_MERGES", "1000")
    with pytest.raises(TokenizerError, match=re.escape(
            f"{folder / 'tokenizer.json'} has 2,000 merges, more than the 1,000 a tokenizer may have (real ones have "
            f"up to about 500,000); if you trust it, raise the limit: SFTDATA_MAX_TOKENIZER_MERGES=2000") + "$"):
        load_hf_tokenizer(folder)
    monkeypatch.setenv("SFTDATA_MAX_TOKENIZER_MERGES", "2000")
    with pytest.raises(TokenizerError, match=r"has 2,256 vocabulary entries, more than the 2,000"):
        load_hf_tokenizer(folder)
    monkeypatch.setenv("SFTDATA_MAX_TOKENIZER_MERGES", "2256")
    tok = load_hf_tokenizer(folder)
    last = json.loads((folder / "tokenizer.json").read_text())["model"]["merges"][-1].replace(" ", "")
    assert tok.token_id(last) == 256 + 2_000 - 1 and tok.encode("hello")  # a working tokenizer


def test_threads_in_library_calls_at_once_share_one_redirect(capfd):
    import os
    import threading

    from sftdata.tokenize.guard import library_call

    inside = threading.Barrier(3)
    release = threading.Event()

    class Writer:
        path = "t.json"

        @library_call("writing")
        def write(self, text: bytes):
            inside.wait()
            release.wait()
            os.write(2, text)

    threads = [threading.Thread(target=Writer().write, args=(t,)) for t in (b"one\n", b"two\n")]
    for t in threads:
        t.start()
    inside.wait()  # both threads are in a call: standard error is redirected once
    release.set()
    for t in threads:
        t.join()
    os.write(2, b"after\n")  # and it is back where it was
    assert sorted(capfd.readouterr().err.splitlines()) == ["after", "one", "two"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
@pytest.mark.parametrize("where", ["additional_chat_templates/tool_use.jinja", "chat_templates/tool_use.jinja",
                                   "chat_template.jinja", "tokenizer_config.json", "special_tokens_map.json"])
def test_a_fifo_in_a_model_folder_is_refused_by_name_unopened(tmp_path, where):
    folder = big_tokenizer(tmp_path / "tok", 10)
    fifo = folder / where
    fifo.parent.mkdir(exist_ok=True)
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    with pytest.raises(TokenizerError, match=re.escape(
            f"{fifo} is a named pipe (FIFO), not a regular file: a model folder's files are read only when they are "
            f"regular files (reading a pipe or device could wait forever or never end); replace it with the file "
            f"itself") + "$"):
        load_hf_tokenizer(folder)


def test_read_limited_refuses_a_device_and_a_folder_and_reads_a_link_to_a_file(tmp_path):
    (tmp_path / "real.json").write_bytes(b"{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert read_limited(tmp_path / "link.json") == b"{}"
    assert present(tmp_path / "link.json") and not present(tmp_path / "absent.json")
    (tmp_path / "zero").symlink_to("/dev/zero")  # endless: refused before it is opened
    with pytest.raises(TokenizerError, match=re.escape(f"{tmp_path / 'zero'} is a character device, not a regular "
                                                       f"file")):
        read_limited(tmp_path / "zero")
    with pytest.raises(TokenizerError, match=re.escape(f"{tmp_path} is a folder, not a regular file")):
        present(tmp_path)


def _with_normalizer(folder, normalizer):
    doc = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    doc["normalizer"] = normalizer
    (folder / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    return folder


def test_a_normalizer_that_makes_100_kb_of_a_character_is_refused_at_load(tmp_path, monkeypatch):
    # loaded, it made the library allocate gigabytes for one record of 'a's: SIGABRT, nothing said
    folder = _with_normalizer(big_tokenizer(tmp_path / "tok", 10),
                              {"type": "Replace", "pattern": {"String": "a"}, "content": "x" * 100_000})
    message = (f"{folder / 'tokenizer.json'}: its normalizer can make up to 100,000 characters of each character of "
               f"a text (a Replace with 100,000 characters at tokenizer.json.normalizer), more than the 128 a "
               f"tokenizer may (real ones: at most about 66), so one record could take gigabytes to normalize; if "
               f"you trust it, raise the limit: SFTDATA_MAX_NORMALIZER_EXPANSION=100000")
    with pytest.raises(TokenizerError, match=re.escape(message) + "$"):
        load_hf_tokenizer(folder)
    monkeypatch.setenv("SFTDATA_MAX_NORMALIZER_EXPANSION", "100000")
    assert load_hf_tokenizer(folder).encode_rendered("ba").ids.size > 0  # trusted: loaded


@pytest.mark.parametrize("normalizer,bound", [
    (None, 1.0),
    ({"type": "NFC"}, 3.0),  # Qwen2/2.5/3
    ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},  # Llama 2, Mistral
                                          {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}, 2.0),
    ({"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None,
      "lowercase": True}, 36.0),
    ({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": "▁"}, 2.0),  # XLM-R's: a regex may match one
    ({"type": "Replace", "pattern": {"String": ""}, "content": "ab"}, 3.0),  # between every two characters
    ({"type": "Sequence", "normalizers": [{"type": "Replace", "pattern": {"String": "a"}, "content": "aa"}] * 20},
     2.0 ** 20),  # twenty doublings: a million times
])
def test_a_normalizers_expansion_is_bounded_from_the_file(normalizer, bound):
    assert normalizer_expansion(normalizer)[0] == bound


def test_a_precompiled_map_is_bounded_by_its_longest_replacement():
    trie = b"\x01\x02\x03\x04"
    blob = len(trie).to_bytes(4, "little") + trie + b"a\0" + b"x" * 300 + b"\0bc\0"
    charsmap = base64.b64encode(blob).decode()
    assert normalizer_expansion({"type": "Precompiled", "precompiled_charsmap": charsmap}) == (
        300.0, "a Precompiled map with a replacement of 300 bytes at tokenizer.json.normalizer")

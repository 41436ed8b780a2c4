"""Reasoning, history and reply starts on real model templates: the ones TRL's wheel ships
(``trl/chat_templates/``, read from the installed package at test time, never copied here),
each with a byte-level BPE tokenizer trained in the test holding the template's markers as
special tokens (as in its model). The oracle is transformers' ``apply_chat_template``: every
kept episode is token-identical to its render of the record (or of the record's per-reply
prefixes), with the reasoning the template renders trained.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from sftdata.errors import RecordError
from sftdata.prepare import PrepareOptions, prepare
from sftdata.records.conversation import parse_record
from sftdata.template import model_profile, records_episodes, template_summary, tokenizer_state
from sftdata.tokenize.open import load_hf_tokenizer
from sftdata.verify import verify
from sftdata.verify.template import rederived_rule_problems
from tests.helpers.templates import CORPUS, train_tokenizer
from tests.helpers.zoo import RECORD_TEXT, RECORDS, WEATHER, reference_messages, template_tokens, zoo_folder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the proof extra)")
trl = pytest.importorskip("trl", reason="trl is not installed: its wheel ships the model templates tested here")
TRL_TEMPLATES = Path(trl.__file__).parent / "chat_templates"

# LLaMA-Factory-style reasoning with tool use: reasoning on a call, on the answer after its
# result, and on a later exchange
REASON_TOOL = {"tools": [WEATHER], "messages": [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "reasoning_content": "I should call the weather tool.", "content": "", "tool_calls": [
        {"id": "a1b2c3d4e", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
    {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": '{"temperature": 18, "sky": "sunny"}'},
    {"role": "assistant", "reasoning_content": "The tool says 18 and sunny.",
     "content": "It is 18 degrees and sunny in Paris."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "reasoning_content": "They thank me.", "content": "You are welcome."}]}
# one exchange: the reasoning of the reply being generated
LAST_ONLY = {"messages": [{"role": "user", "content": "What is 17*3?"},
                          {"role": "assistant", "reasoning_content": "17*3 = 51.", "content": "51"}]}
_BOS = ("<|startoftext|>", "<s>", "<bos>", "<|begin_of_text|>", "<｜begin▁of▁sentence｜>", "<BOS_TOKEN>")
_EOS = ("<|return|>", "<|im_end|>", "<|endoftext|>", "<｜end▁of▁sentence｜>", "<|END_OF_TURN_TOKEN|>", "</s>", "<eos>")


def trl_template(stem: str) -> str:
    """TRL's template ``stem``, or with ``zoo:`` the zoo folder's (tests/helpers/zoo.py)."""
    if stem.startswith("zoo:"):
        folder = zoo_folder()
        if folder is None or not (folder / f"{stem[4:]}.jinja").is_file():
            pytest.skip(f"the template zoo holds no {stem[4:]}.jinja")
        return (folder / f"{stem[4:]}.jinja").read_text(encoding="utf-8")
    path = TRL_TEMPLATES / f"{stem}.jinja"
    if not path.is_file():
        pytest.skip(f"trl {trl.__version__} ships no {path.name}")
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A model folder per TRL template: a tokenizer trained with its markers, its own
    template; the sftdata tokenizer, profile (``per_reply``) and transformers' tokenizer."""
    made: dict = {}

    def get(stem: str, per_reply: bool = False):
        if (stem, per_reply) not in made:
            text = trl_template(stem)
            special, tags = template_tokens(text)
            bos = next((t for t in _BOS if t in special), None)
            eos = next((t for t in _EOS if t in special), None)
            out = tmp_path_factory.mktemp("trl") / stem.replace(":", "_")
            train_tokenizer(out, special, extra=[t for t in tags if t not in special], vocab_size=900,
                            corpus=CORPUS + RECORD_TEXT + [json.dumps(REASON_TOOL)] * 20
                            + [" ".join(re.findall(r"[A-Za-z]+", text))] * 3,
                            bos=bos, eos=eos)
            (out / "chat_template.jinja").write_text(text, encoding="utf-8")
            tok = load_hf_tokenizer(out)
            made[(stem, per_reply)] = (tok, model_profile(tok, "model", per_reply=per_reply),
                                       transformers.AutoTokenizer.from_pretrained(str(out)))
        return made[(stem, per_reply)]
    return get


def prepared(record: dict, tok, profile):
    (result,) = records_episodes([(parse_record(record, "r", "tool"), "r")], profile, tok, None)
    return result


def assert_exact(result, record: dict, tok, profile, hf) -> None:
    """Every episode is transformers' render of the record (one episode) or of the prefix
    ending at its reply (one per reply), and trains exactly one run per reply through an
    end-of-turn id, holding the reply's reasoning."""
    messages, tools = reference_messages(record, profile.arguments)
    for ep in result.episodes:
        upto = messages if len(result.episodes) == 1 else messages[:ep.spans[-1][0] + 1]
        theirs = list(hf.apply_chat_template(upto, tools=tools, tokenize=True, return_dict=False))
        assert ep.ids.tolist() == theirs
        trained = tok.decode(ep.ids[ep.mask.astype(bool)].tolist())
        last = upto[-1]
        assert last.get("reasoning_content", "") in trained and last["content"] in trained
        assert int(ep.ids[np.flatnonzero(ep.mask)[-1]]) in profile.rule.end_ids


# where each TRL template renders reasoning_content (transformers confirms below)
POSITIONS = {"gptoss": "last", "qwen3": "last", "glm4moe": "last", "nemotron_3_nano": "last",
             "muse_glimmer": "every", "llama3_1": "none", "deepseekv3": "none", "cohere2": "none",
             "qwen2_5": "none", "phi3": "none"}


@pytest.mark.parametrize("stem", sorted(POSITIONS))
def test_reasoning_position_is_probed_as_transformers_renders_it(model, stem):
    tok, profile, hf = model(stem)
    assert profile.reasoning == POSITIONS[stem]
    assert profile.state()["chat_template"]["reasoning_position"] == POSITIONS[stem]  # tokenizer_state.json
    assert template_summary(tok, profile)["template"]["reasoning_position"] == POSITIONS[stem]  # the metadata
    assert ("reasoning" in profile.unsupported) == (POSITIONS[stem] == "none")
    messages, _ = reference_messages(RECORDS["reasoning"])
    whole = hf.apply_chat_template(messages, tokenize=False)
    first = hf.apply_chat_template(messages[:2], tokenize=False)
    shown = [messages[1]["reasoning_content"] in whole, messages[3]["reasoning_content"] in whole,
             messages[1]["reasoning_content"] in first]
    assert shown == {"every": [True, True, True], "last": [False, True, True], "none": [False, False, False]}[
        POSITIONS[stem]]


def test_gpt_oss_trains_the_reasoning_of_the_reply_it_renders_as_transformers_does(model):
    tok, profile, hf = model("gptoss")
    result = prepared(LAST_ONLY, tok, profile)
    assert not isinstance(result, RecordError), result.detail
    assert len(result.episodes) == 1 and "reasoning_ignored_by_template" not in result.counts
    assert profile.rule.joined_spans  # learned: a reply is two spans, kept together one reply at a time
    assert_exact(result, LAST_ONLY, tok, profile, hf)
    ep = result.episodes[0]
    # two trained runs: the analysis message and the final one, the header between them untrained
    runs = np.flatnonzero(np.diff(np.concatenate([[0], ep.mask.astype(np.int8), [0]]))).reshape(-1, 2)
    assert [tok.decode(ep.ids[a:b].tolist()) for a, b in runs] == [
        "<|channel|>analysis<|message|>17*3 = 51.<|end|>", "<|channel|>final<|message|>51<|return|>"]


@pytest.mark.parametrize("stem", ["gptoss", "qwen3", "glm4moe"])
@pytest.mark.parametrize("kind", ["reasoning", "reason_tool"])
def test_reasoning_dropped_from_history_is_exact_one_reply_at_a_time(model, stem, kind):
    """Earlier replies' reasoning, which the whole render drops: per reply, each episode the
    prefix ending at its reply, identical to transformers', its reasoning trained."""
    record = REASON_TOOL if kind == "reason_tool" else RECORDS["reasoning"]
    replies = [k for k, m in enumerate(record["messages"]) if m["role"] == "assistant"]
    for per_reply in (False, True):  # automatically (each episode flagged last-reply-only), and --per-reply
        tok, profile, hf = model(stem, per_reply=per_reply)
        result = prepared(record, tok, profile)
        assert not isinstance(result, RecordError), result.detail
        assert [ep.spans[-1][0] for ep in result.episodes] == replies
        assert result.automatic == (not profile.rule.last_reply_only)
        assert [ep.last_only for ep in result.episodes] == [result.automatic] * len(replies)
        if profile.appended_stop is None:
            assert_exact(result, record, tok, profile, hf)


def test_reasoning_no_template_renders_is_dropped_and_counted(model):
    tok, profile, hf = model("llama3_1")
    result = prepared(RECORDS["reasoning"], tok, profile)
    assert result.counts.count("reasoning_ignored_by_template") == 2


def test_a_header_that_merges_with_the_reply_gives_the_boundary_token_to_the_reply(model):
    """Qwen 3.5's generation prompt ``<|im_start|>assistant\\n<think>\\n`` before its empty
    think block: the header's last newline and the block's first are one token, trained
    with the reply (the one rule verify re-applies); the template is no longer refused."""
    tok, profile, hf = model("qwen3_5_think")
    assert not profile.rule.joined_spans
    result = prepared(RECORDS["chat"], tok, profile)
    assert not isinstance(result, RecordError), result.detail
    messages, _ = reference_messages(RECORDS["chat"])
    ep = result.episodes[0]
    assert ep.ids.tolist() == list(hf.apply_chat_template(messages, tokenize=True, return_dict=False))
    runs = np.flatnonzero(np.diff(np.concatenate([[0], ep.mask.astype(np.int8), [0]]))).reshape(-1, 2)
    a, b = runs[-1]
    assert [tok.decode([int(i)]) for i in ep.ids[a - 3:a + 2]] == ["assistant", "\n", "<think>", "\n\n", "</think>"]
    assert tok.decode(ep.ids[a:b].tolist()) == "\n\n</think>\n\nThe capital of France is Paris.<|im_end|>"
    header = tuple(int(i) for i in ep.ids[a - 4:a])
    assert header in profile.rule.headers and header + (int(ep.ids[a - 2]),) in profile.rule.headers  # + "\\n"
    assert rederived_rule_problems(tokenizer_state(tok, profile), tok) == []  # verify learns the same rule again


def test_generation_blocks_ending_after_their_end_of_turn_token_are_not_refused(model):
    """LFM2.5's blocks hold ``<|im_end|>\\n``: trained through ``<|im_end|>``, the newline not;
    one reply at a time its reasoning is trained, as transformers renders each prefix."""
    tok, profile, hf = model("lfm2_2_5")
    assert profile.generation and profile.reasoning == "last"
    result = prepared(RECORDS["chat"], tok, profile)
    assert not isinstance(result, RecordError), result.detail
    assert_exact(result, RECORDS["chat"], tok, profile, hf)
    ep = result.episodes[0]
    assert tok.decode(ep.ids[ep.mask.astype(bool)].tolist()) == \
        "I am well, thank you. How can I help?<|im_end|>The capital of France is Paris.<|im_end|>"
    for per_reply in (False, True):  # one reply at a time automatically, as with --per-reply
        tok, profile, hf = model("lfm2_2_5", per_reply=per_reply)
        result = prepared(REASON_TOOL, tok, profile)
        assert not isinstance(result, RecordError), result.detail
        assert len(result.episodes) == 3 and result.automatic == (not per_reply)
        assert_exact(result, REASON_TOOL, tok, profile, hf)


def test_an_end_of_turn_token_the_reply_also_opens_with_is_passed_over(model):
    """Kimi K3 closes the reasoning with ``<|close|>think`` and the answer with
    ``<|close|>response`` before ending the turn with ``<|end_of_msg|>``: the end-of-turn token
    is the first one after a reply's text that its opening does not hold, so every reply's
    reasoning and answer are one trained run, token-identical to transformers'."""
    tok, profile, hf = model("zoo:Kimi-K3")
    assert profile.layout.end_texts[0] == "<|end_of_msg|>" and profile.reasoning == "every"
    result = prepared(REASON_TOOL, tok, profile)
    assert not isinstance(result, RecordError), result.detail
    assert len(result.episodes) == 1
    assert_exact(result, REASON_TOOL, tok, profile, hf)
    trained = tok.decode(result.episodes[0].ids[result.episodes[0].mask.astype(bool)].tolist())
    for m in REASON_TOOL["messages"]:
        if m["role"] == "assistant":
            assert m["reasoning_content"] in trained and m["content"] in trained


def test_a_template_that_reads_only_text_parts_is_located(model):
    """Idefics3's template reads each message's content as a list of parts (a string renders
    no text): replies are located with the parts' text, token-identical to transformers'
    render of the same messages given as parts."""
    tok, profile, hf = model("idefics3")
    assert profile.content == "parts"
    result = prepared(RECORDS["chat"], tok, profile)
    assert not isinstance(result, RecordError), result.detail
    messages, _ = reference_messages(RECORDS["chat"])
    parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in messages]
    ep = result.episodes[0]
    assert ep.ids.tolist() == list(hf.apply_chat_template(parts, tokenize=True, return_dict=False))
    assert tok.decode(ep.ids[ep.mask.astype(bool)].tolist()) == \
        " I am well, thank you. How can I help?<end_of_utterance> The capital of France is Paris.<end_of_utterance>"


RWKV = "zoo:llama-cpp-rwkv-world"  # ``User: ...\n\nAssistant: ...\n\n``: no special token at all
PARAGRAPHS = {"messages": [{"role": "user", "content": "Two lines?"},
                           {"role": "assistant", "content": "One.\n\nTwo."}]}
LEADING = {"messages": [{"role": "assistant", "content": "Welcome! Ask me anything."},
                        {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "It is 4."}]}


def test_a_template_that_ends_replies_with_text_gets_its_rule_from_the_marker(model):
    """RWKV World closes a reply with ``\\n\\n``, no special token: the marker is the end of
    turn, its ids as tokenized in context (``\\n\\n`` alone at the end of a text, ``\\n``,
    ``\\n`` before the next turn) end a reply; every episode token-identical to transformers'."""
    tok, profile, hf = model(RWKV)
    nl, nlnl = tok.token_id("\u010a"), tok.token_id("\u010a\u010a")  # byte-level "\n" and "\n\n"
    assert profile.layout.end_texts == ("\n\n",) and profile.appended_stop is None
    assert profile.rule.end_ids == (nlnl,) and profile.rule.end_seqs == ((nl, nl),)
    assert profile.state()["mask_rule"]["end_seqs"] == [[nl, nl]]
    result = prepared(RECORDS["chat"], tok, profile)
    assert not isinstance(result, RecordError), result.detail
    assert_exact(result, RECORDS["chat"], tok, profile, hf)
    ep = result.episodes[0]
    assert tok.decode(ep.ids[ep.mask.astype(bool)].tolist()) == \
        " I am well, thank you. How can I help?\n\n The capital of France is Paris.\n\n"
    assert rederived_rule_problems(tokenizer_state(tok, profile), tok) == []
    # reasoning it renders for no reply: dropped and counted, the rest exact
    result = prepared(RECORDS["reasoning"], tok, profile)
    assert result.counts.count("reasoning_ignored_by_template") == 2
    messages, _ = reference_messages(RECORDS["reasoning"], reasoning=False)
    assert result.episodes[0].ids.tolist() == list(hf.apply_chat_template(messages, tokenize=True, return_dict=False))
    # tool calls it never renders (transformers' render holds no call): refused by name
    result = prepared(RECORDS["tool"], tok, profile)
    assert isinstance(result, RecordError) and result.reason == "template_cannot_render_tools"
    messages, tools = reference_messages(RECORDS["tool"])
    assert "get_weather" not in hf.apply_chat_template(messages, tools=tools, tokenize=False)
    # a reply that answers no one is not trained, as under every other template
    result = prepared(LEADING, tok, profile)
    assert result.repairs == ("leading_assistant_untrained",)
    assert tok.decode(result.episodes[0].ids[result.episodes[0].mask.astype(bool)].tolist()) == " It is 4.\n\n"


def test_a_reply_holding_the_text_marker_is_rejected_by_name(model):
    """A reply whose own text holds the marker would stop there at inference: rejected as
    ``rule_mismatch`` (transformers renders it, but no rule over the ids can tell its end)."""
    tok, profile, hf = model(RWKV)
    result = prepared(PARAGRAPHS, tok, profile)
    assert isinstance(result, RecordError) and result.reason == "rule_mismatch"
    assert "One.\n\nTwo." in hf.apply_chat_template(PARAGRAPHS["messages"], tokenize=False)


@pytest.mark.parametrize(("stem", "rejected"), [(RWKV, {"rule_mismatch": 1}), ("gptoss_training", {}),
                                               ("muse_glimmer_training", {}), ("diffusion_gemma_training", {})])
def test_a_dataset_under_a_template_refused_whole_before_verifies(model, tmp_path, stem, rejected):
    """prepare under each template that was refused whole before, then verify: every mask
    re-derived by the rule learned again; RWKV World's paragraph reply rejected by name."""
    tok, profile, hf = model(stem)
    src = tmp_path / "chat.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in (RECORDS["chat"], LEADING, PARAGRAPHS)), encoding="utf-8")
    summary = prepare([src], tmp_path / "ds", PrepareOptions(tokenizer=hf.name_or_path, chat_template="model"))
    assert summary.episodes == {"train": 3 - sum(rejected.values())} and summary.rejected == rejected
    report = verify(tmp_path / "ds")
    assert report.ok, [p.message for p in report.problems]


def test_a_reply_no_token_opens_is_rejected_by_name_where_transformers_renders_it(model):
    """Apertus writes the reply after a tool result right after the result's text, inside the
    call's own assistant turn: no token marks where it starts, so no rule over the ids can
    train it. Its chat records are exact; a tool record is rejected as ``reply_not_located``
    (not as a template that cannot render tools: transformers renders it, the reply
    straight after the result)."""
    tok, profile, hf = model("zoo:Apertus-8B-Instruct")
    assert profile.unlocated == {"tools"} and profile.renders_tool_calls
    (ep,) = prepared(RECORDS["chat"], tok, profile).episodes
    messages, _ = reference_messages(RECORDS["chat"])
    theirs = list(hf.apply_chat_template(messages, tokenize=True, return_dict=False))
    assert ep.ids.tolist() == theirs + [tok.token_id(profile.appended_stop)]  # its last reply is left unclosed
    result = prepared(RECORDS["tool"], tok, profile)
    assert isinstance(result, RecordError) and result.reason == "reply_not_located"
    assert "renders them, but writes no assistant header and no special token before a reply" in result.detail
    messages, tools = reference_messages(RECORDS["tool"])
    text = hf.apply_chat_template(messages, tools=tools, tokenize=False)
    assert '"sky": "sunny"}]It is 18 degrees and sunny in Paris.' in text


@pytest.mark.parametrize("stem", ["gptoss_training", "muse_glimmer_training"])
def test_generation_blocks_that_open_with_the_assistant_header_leave_it_untrained(model, stem):
    """TRL's gpt-oss training template puts ``<|start|>assistant`` inside the block: what the
    generation prompt supplies at inference is the header, untrained as under every other
    template, and the rest of the block trained; the template was refused whole before (its
    rule, opening after ``<|end|>``, trained the user turns too)."""
    tok, profile, hf = model(stem)
    assert profile.generation and profile.layout.header_texts == ("<|start|>assistant",)
    assert {"gptoss_training": {"reasoning"}, "muse_glimmer_training": set()}[stem] == set(profile.unsupported)
    for kind in ("chat", "tool") + (("reasoning",) if stem == "muse_glimmer_training" else ()):
        result = prepared(RECORDS[kind], tok, profile)
        assert not isinstance(result, RecordError), result.detail
        assert_exact(result, RECORDS[kind], tok, profile, hf)
    ep = prepared(RECORDS["chat"], tok, profile).episodes[0]
    opens, ends = {"gptoss_training": ("<|channel|>final", ("<|end|>", "<|return|>")),
                   "muse_glimmer_training": (" to=user", ("<|eot|>", "<|eot|>"))}[stem]
    assert tok.decode(ep.ids[ep.mask.astype(bool)].tolist()) == (
        f"{opens}<|message|>I am well, thank you. How can I help?{ends[0]}"
        f"{opens}<|message|>The capital of France is Paris.{ends[1]}")
    assert rederived_rule_problems(tokenizer_state(tok, profile), tok) == []


def test_generation_blocks_that_touch_are_one_reply(model):
    """TRL's diffusion-Gemma training template closes a reply's block and opens another for
    its ``<turn|>\\n``: touching blocks are one, trained through ``<turn|>`` (its newline not,
    as LFM2.5's), where the template was refused whole (some blocks "include the end-of-turn
    token and some do not")."""
    tok, profile, hf = model("diffusion_gemma_training")
    assert profile.generation and profile.rule.end_inclusive and not profile.unsupported
    for record in (RECORDS["chat"], RECORDS["tool"], RECORDS["reasoning"], REASON_TOOL):
        result = prepared(record, tok, profile)
        assert not isinstance(result, RecordError), result.detail
        assert_exact(result, record, tok, profile, hf)
    result = prepared(RECORDS["chat"], tok, profile)
    ep = result.episodes[0]
    assert tok.decode(ep.ids[ep.mask.astype(bool)].tolist()) == \
        "I am well, thank you. How can I help?<turn|>The capital of France is Paris.<turn|>"

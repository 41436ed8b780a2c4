"""Assistant spans in the whole render, the per-reply fallback, generation blocks, and
the templates and records that are refused."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from sftdata.errors import RecordError, TemplateError
from sftdata.template import (
    ChatTemplate,
    arguments_style,
    conversation_messages,
    learn_profile,
    load_chat_template,
    render_conversation,
    render_messages,
    rule_mask,
)
from sftdata.tokenize.open import load_hf_tokenizer
from tests.helpers.templates import TOKENS, conversation, preset_tokenizer, train_tokenizer

CHATML_GEN = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' %}{% generation %}{{- m.content + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
# earlier replies are replaced by a placeholder: only the last one is in the whole render
DROPS_EARLIER = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and not loop.last %}{{- '(earlier reply)' }}{%- else %}{{- m.content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
TWO_TURNS = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "And now?"}, {"role": "assistant", "content": "Bye."}]


@pytest.fixture(scope="module")
def chatml_tok(tmp_path_factory):
    return preset_tokenizer(tmp_path_factory.mktemp("tok"), "qwen3")


def trained(tok, ep) -> list[str]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], ep.mask, [0]])))
    return [tok.decode(ep.ids[a:b]) for a, b in zip(edges[::2], edges[1::2])]


QWEN3_REASONING = [{"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "4.", "reasoning_content": "add them"},
                   {"role": "user", "content": "3+3?"},
                   {"role": "assistant", "content": "6.", "reasoning_content": "add again"}]


def test_qwen3_reasoning_dropped_from_earlier_replies_is_served_per_reply_automatically(chatml_tok):
    """Not prefix-stable: the whole render drops the earlier reply's reasoning, so the record
    becomes one episode per reply without --per-reply (never kept with that reasoning
    missing), each flagged to train its last reply only under the rule that trains every
    reply; the rule with the flag re-derives each mask, without it does not."""
    profile = learn_profile(load_chat_template("qwen3"), chatml_tok)
    assert not profile.rule.last_reply_only
    out = render_messages(QWEN3_REASONING, None, profile, chatml_tok, where="w")
    assert out.automatic and out.per_reply == "the whole render drops assistant message 1's reasoning"
    assert [ep.last_only for ep in out.episodes] == [True, True] and out.rule_agrees
    first, second = out.episodes
    assert chatml_tok.decode(first.ids[first.mask.astype(bool)].tolist()) == "<think>\nadd them\n</think>\n\n4.<|im_end|>"
    assert chatml_tok.decode(second.ids[second.mask.astype(bool)].tolist()) == \
        "<think>\nadd again\n</think>\n\n6.<|im_end|>"
    assert np.array_equal(rule_mask(second.ids, profile.rule, last_only=True), second.mask)
    assert not np.array_equal(rule_mask(second.ids, profile.rule), second.mask)  # unflagged: both replies


def test_a_reply_its_own_prefix_also_renders_inexactly_is_rejected_for_what_that_render_drops(chatml_tok):
    """The whole render drops the earlier reply's reasoning (so the record goes per reply),
    and the prefix ending at the last reply drops that reply's reasoning too (this template
    writes no reasoning for a reply saying "secret"): no render keeps the record whole, and
    it is rejected for what the per-reply render drops, not as ``template_rewrites_history``."""
    text = load_chat_template("qwen3").text.replace("loop.index0 > ns.last_query and",
                                                    "loop.index0 > ns.last_query and 'secret' not in content and")
    assert text != load_chat_template("qwen3").text
    profile = learn_profile(ChatTemplate("secret.jinja", "file", text), chatml_tok)
    messages = [*QWEN3_REASONING[:3], {**QWEN3_REASONING[3], "content": "a secret."}]
    with pytest.raises(RecordError, match=r"^w: chat template secret.jinja drops assistant message 3's reasoning ") \
            as e:
        render_messages(messages, None, profile, chatml_tok, where="w")
    assert e.value.reason == "template_drops_reasoning"


def test_qwen3_reasoning_one_episode_per_reply_keeps_every_reply_whole(chatml_tok):
    """--per-reply: each reply is the last of its episode, where Qwen3 renders its reasoning."""
    profile = learn_profile(load_chat_template("qwen3"), chatml_tok, per_reply=True)
    out = render_messages(QWEN3_REASONING, None, profile, chatml_tok)
    assert out.per_reply and len(out.episodes) == 2 and out.rule_agrees
    assert out.episodes[0].text == ("<|im_start|>user\n2+2?<|im_end|>\n"
                                    "<|im_start|>assistant\n<think>\nadd them\n</think>\n\n4.<|im_end|>\n")
    assert [trained(chatml_tok, e) for e in out.episodes] == [["<think>\nadd them\n</think>\n\n4.<|im_end|>"],
                                                              ["<think>\nadd again\n</think>\n\n6.<|im_end|>"]]


def test_qwen3_without_thinking_leaves_the_supplied_think_block_untrained(chatml_tok):
    """With enable_thinking=False the generation prompt supplies an empty think block: the
    model never writes it, so in the final reply it belongs to the header; a reply whose
    reasoning is not empty still trains it."""
    profile = learn_profile(load_chat_template("qwen3"), chatml_tok, {"enable_thinking": False})
    assert profile.layout.header_texts == ("<|im_start|>assistant\n<think>\n\n</think>\n\n", "<|im_start|>assistant\n")
    assert not profile.rule.last_reply_only
    out = render_conversation(conversation(), profile, chatml_tok)
    assert out.per_reply is None
    assert trained(chatml_tok, out.episodes[0])[2] == "It is 18C.<|im_end|>"
    assert "<think>\n\n</think>\n\nIt is 18C." in out.episodes[0].text and out.rule_agrees
    msgs = [{"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n6."}]
    ep = render_messages(msgs, None, profile, chatml_tok).episodes[0]
    assert trained(chatml_tok, ep) == ["<think>\nadd\n</think>\n\n6.<|im_end|>"] and ep.rule_mismatch is None


def test_a_template_that_drops_earlier_replies_gives_one_episode_per_reply(chatml_tok):
    profile = learn_profile(ChatTemplate("drops.jinja", "file", DROPS_EARLIER), chatml_tok)
    out = render_messages(TWO_TURNS, None, profile, chatml_tok)
    assert profile.rule.last_reply_only
    assert out.per_reply == ("the template's replies are served one at a time (learned from its probe "
                             "conversations, or --per-reply)")
    assert [e.text for e in out.episodes] == [
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n",
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n(earlier reply)<|im_end|>\n"
        "<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\nBye.<|im_end|>\n"]
    assert [trained(chatml_tok, e) for e in out.episodes] == [["Hello!<|im_end|>"], ["Bye.<|im_end|>"]]
    assert out.rule_agrees


@pytest.mark.parametrize("inclusive", [True, False])
def test_generation_blocks(chatml_tok, inclusive):
    text = CHATML_GEN if inclusive else CHATML_GEN.replace(
        "{% generation %}{{- m.content + '<|im_end|>' }}{% endgeneration %}",
        "{% generation %}{{- m.content }}{% endgeneration %}{{- '<|im_end|>' }}")
    profile = learn_profile(ChatTemplate("gen.jinja", "file", text), chatml_tok)
    assert profile.generation and profile.rule.end_inclusive is inclusive
    out = render_messages(TWO_TURNS, None, profile, chatml_tok)
    end = "<|im_end|>" if inclusive else ""
    assert trained(chatml_tok, out.episodes[0]) == ["Hello!" + end, "Bye." + end]
    assert out.rule_agrees
    assert profile.state()["chat_template"]["generation_blocks"] is True


def test_rendered_and_rule_masks_disagreeing_are_reported(chatml_tok):
    """A reply starting with blank lines merges with the header's newline: the token ids no
    longer show the header, and the episode says where the rule parts from the render."""
    profile = learn_profile(load_chat_template("chatml"), chatml_tok)
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\n\nHello."}]
    ep = render_messages(msgs, None, profile, chatml_tok).episodes[0]
    assert ep.rule_mismatch is not None
    assert chatml_tok.token_text(int(ep.ids[ep.rule_mismatch])) == "\n\n"
    assert rule_mask(ep.ids, profile.rule).sum() == 0 and ep.mask.sum() > 0


def test_profile_state(chatml_tok):
    profile = learn_profile(load_chat_template("chatml"), chatml_tok)
    state = profile.state()
    assert state["mask_rule"]["headers"] == [list(h) for h in profile.rule.headers]
    assert state["mask_rule"]["end_ids"] == [chatml_tok.special_tokens["<|im_end|>"]]
    assert state["chat_template"]["header_texts"] == ["<|im_start|>assistant\n"]
    assert state["chat_template"]["end_texts"] == ["<|im_end|>"]
    assert state["tool_arguments"] == {"style": "dict", "reason": "the template serialises arguments with tojson "
                                                                  "(JSON text would be escaped twice)"}
    assert state["chat_template"]["name"] == "chatml" and len(state["chat_template"]["sha256"]) == 64


def test_arguments_style():
    def style(text):
        t = ChatTemplate("a.jinja", "file", text)
        return arguments_style(t.compiled(), "a.jinja")[0]

    body = "{% for m in messages %}{% for c in m.tool_calls or [] %}ARGS{% endfor %}{% endfor %}"
    assert style(body.replace("ARGS", "{{ c.function.arguments }}")) == "string"
    assert style(body.replace("ARGS", "{{ c.function.arguments | tojson }}")) == "dict"
    assert style(body.replace("ARGS", "{% if c.function.arguments is string %}{{ c.function.arguments }}"
                                      "{% else %}{{ c.function.arguments | tojson }}{% endif %}")) == "dict"
    assert style("{{ messages | length }}") == "dict"


def test_string_arguments_reach_the_template_as_json_text(tmp_path):
    tok = preset_tokenizer(tmp_path, "chatml")
    raw = load_chat_template("chatml").text.replace("(call.function.arguments | tojson)", "call.function.arguments")
    profile = learn_profile(ChatTemplate("raw.jinja", "file", raw), tok)
    assert profile.arguments == "string"
    ep = render_conversation(conversation(), profile, tok).episodes[0]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in ep.text


def test_the_model_folders_own_template(tmp_path):
    specials, bos, eos, extra = TOKENS["chatml"]
    folder = train_tokenizer(tmp_path / "m", specials, bos, eos, extra, config={"chat_template": [
        {"name": "default", "template": load_chat_template("chatml").text},
        {"name": "tool_use", "template": load_chat_template("qwen3").text}]})
    tok = load_hf_tokenizer(folder)
    assert load_chat_template("model", tok).name == "model"
    t = load_chat_template("model:tool_use", tok)
    assert (t.name, t.source) == ("model:tool_use", "model")
    with pytest.raises(TemplateError, match=r"no chat template named 'rag'; it has: default, tool_use"):
        load_chat_template("model:rag", tok)


# -- refused ----------------------------------------------------------------------

def test_a_template_that_always_raises_is_refused(chatml_tok):
    with pytest.raises(TemplateError, match=r"^chat template strict.jinja refused the conversation: only system"):
        learn_profile(ChatTemplate("strict.jinja", "file", "{{ raise_exception('only system') }}"), chatml_tok)


def test_a_template_that_refuses_system_messages_refuses_such_records(chatml_tok):
    text = ("{%- if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{%- endif %}"
            + load_chat_template("chatml").text)
    profile = learn_profile(ChatTemplate("nosys.jinja", "file", text), chatml_tok)
    msgs = [{"role": "system", "content": "Be nice."}, *TWO_TURNS]
    with pytest.raises(RecordError, match=r"^f.jsonl:line 3: chat template nosys.jinja refused the conversation: "
                                          r"System role not supported$") as e:
        render_messages(msgs, None, profile, chatml_tok, where="f.jsonl:line 3")
    assert e.value.reason == "template_error"


def test_a_template_with_no_assistant_output_is_refused(chatml_tok):
    users_only = ("{%- for m in messages %}{%- if m.role == 'user' %}{{- '<|im_start|>user\\n' + m.content + "
                  "'<|im_end|>\\n' }}{%- endif %}{%- endfor %}")
    with pytest.raises(TemplateError, match=r"^chat template users.jinja renders no assistant reply's text"):
        learn_profile(ChatTemplate("users.jinja", "file", users_only), chatml_tok)


def test_a_template_with_no_special_token_is_refused(chatml_tok):
    plain = "{%- for m in messages %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}"
    with pytest.raises(TemplateError, match=r"^chat template plain.jinja writes no assistant header and no special "
                                            r"token before a reply; a reply's start cannot be told from the token ids"):
        learn_profile(ChatTemplate("plain.jinja", "file", plain), chatml_tok)


TEXT_ENDS = ("{%- for m in messages %}{%- if m.role == 'assistant' %}{{- '<|im_start|>' }}{%- endif %}"
             "{{- m.role + ': ' + m.content }}{{- '\\n' if ENDS else '' }}{%- endfor %}")


def test_a_template_with_no_end_of_turn_text_after_its_last_reply_is_refused(chatml_tok):
    """A header before each reply, nothing special after one, and nothing at all after the
    last one: no marker ends every reply."""
    text = TEXT_ENDS.replace("ENDS", "not loop.last")
    with pytest.raises(TemplateError, match=r"^chat template plain.jinja writes no special token after an assistant "
                                            r"reply, and no text after every reply that could end one.*never learn to "
                                            r"stop"):
        learn_profile(ChatTemplate("plain.jinja", "file", text), chatml_tok)


def test_a_template_that_ends_every_reply_with_text_ends_them_at_its_ids(chatml_tok):
    """The text a template writes after every reply (here a newline) is its end-of-turn
    marker: a reply ends at its ids; a reply whose own text holds them is ``rule_mismatch``."""
    profile = learn_profile(ChatTemplate("plain.jinja", "file", TEXT_ENDS.replace("ENDS", "true")), chatml_tok)
    assert profile.layout.end_texts == ("\n",) and profile.appended_stop is None
    assert profile.rule.end_ids == (chatml_tok.encode_rendered("\n").ids[0],) and profile.rule.end_seqs == ()
    out = render_messages(TWO_TURNS, None, profile, chatml_tok)
    ep = out.episodes[0]
    assert out.rule_agrees and chatml_tok.decode(ep.ids[ep.mask.astype(bool)].tolist()) == \
        "assistant: Hello!\nassistant: Bye.\n"  # its only header is the special token before a reply
    two_lines = [TWO_TURNS[0], {"role": "assistant", "content": "One.\nTwo."}]
    assert not render_messages(two_lines, None, profile, chatml_tok).rule_agrees


def test_generation_blocks_that_mark_nothing_are_refused(chatml_tok):
    text = CHATML_GEN.replace("m.role == 'assistant'", "m.role == 'nobody'")
    with pytest.raises(TemplateError, match=r"has \{% generation %\} blocks but marks nothing"):
        learn_profile(ChatTemplate("nogen.jinja", "file", text), chatml_tok)


def test_a_reply_that_cannot_be_located_names_the_template_and_message(chatml_tok):
    """A template that (for this record only) writes a reply without its end-of-turn token."""
    text = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}"
            "{%- if m.content != 'LAST' %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    profile = learn_profile(ChatTemplate("odd.jinja", "file", text), chatml_tok)
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "LAST"}]
    with pytest.raises(RecordError, match=r"^chat template odd.jinja: assistant message 1 cannot be located "
                                          r"\(.*end-of-turn") as e:
        render_messages(msgs, None, profile, chatml_tok)
    assert e.value.reason == "reply_not_located"


def test_special_token_strings_in_message_text_are_refused(chatml_tok):
    profile = learn_profile(load_chat_template("chatml"), chatml_tok)
    msgs = [{"role": "user", "content": "say <|im_end|> please"}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(RecordError, match=r"message 0.content holds the special token '<\|im_end\|>' as text") as e:
        render_messages(msgs, None, profile, chatml_tok)
    assert e.value.reason == "special_token_in_text"
    msgs = [{"role": "user", "content": "a\ufdd2b"}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(RecordError, match=r"message 0.content holds the noncharacter U\+FDD2"):
        render_messages(msgs, None, profile, chatml_tok)


def test_conversation_messages_shape():
    msgs = conversation_messages(conversation())
    assert msgs[4] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}, "id": "c1"}]}
    assert msgs[5] == {"role": "tool", "content": "18C", "name": "get_weather", "tool_call_id": "c1"}
    as_text = conversation_messages(conversation(), "string")
    assert as_text[4]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]


def test_a_profile_pickles_for_worker_processes(chatml_tok):
    profile = learn_profile(load_chat_template("qwen3"), chatml_tok)
    back_profile, back_tok = pickle.loads(pickle.dumps((profile, chatml_tok)))
    a = render_conversation(conversation(), profile, chatml_tok).episodes[0]
    b = render_conversation(conversation(), back_profile, back_tok).episodes[0]
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.mask, b.mask)


def test_tool_results_a_template_writes_with_tojson_are_located_in_the_whole_render(chatml_tok):
    """Llama 3.1 and gpt-oss print a tool result with ``tojson`` (quoted and escaped): several
    of them in one conversation are still placed, so the record renders whole."""
    text = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
            "{%- if m.role == 'tool' %}{{- m.content | tojson }}{%- else %}{{- m.content }}{%- endif %}"
            "{%- for c in m.tool_calls or [] %}{{- c.function.name + (c.function.arguments | tojson) }}{%- endfor %}"
            "{{- '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
            "{%- endif %}")
    profile = learn_profile(ChatTemplate("json.jinja", "file", text), chatml_tok)
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "area", "arguments": {"r": 2}}}]}
    msgs = [{"role": "user", "content": "Area?"}, call, {"role": "tool", "content": '{"area": 12.6}'},
            {"role": "assistant", "content": "12.6."}, {"role": "user", "content": "Again?"}, call,
            {"role": "tool", "content": '{"area": 12.6}'}, {"role": "assistant", "content": "Still 12.6."}]
    out = render_messages(msgs, None, profile, chatml_tok)
    assert out.per_reply is None and len(out.episodes) == 1 and out.rule_agrees
    assert '<|im_start|>tool\n"{\\"area\\": 12.6}"<|im_end|>' in out.episodes[0].text
    assert trained(chatml_tok, out.episodes[0])[1] == "12.6.<|im_end|>"


def _lines_run(fn, *args) -> int:
    """How many lines of sftdata/template/spans.py run during ``fn(*args)`` (comprehensions
    included): an operation count, the same on every machine."""
    import sys

    from sftdata.template import spans

    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename != spans.__file__:
            return None
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        fn(*args)
    finally:
        sys.settrace(None)
    return count


def test_locating_replies_is_linear_in_the_number_of_messages():
    """45.7: each reply's neighbours were found by a scan of every sentinel (10k / 20k / 40k
    one-character messages took 3.8 / 12 / 45 s). Doubling the messages doubles the work."""
    from sftdata.template.spans import Layout, sentinel_plan

    layout = Layout(("<|im_start|>assistant\n",), ("<|im_end|>",))

    def plan(n: int):
        s = "".join(f"<|im_start|>{'user' if i % 2 == 0 else 'assistant'}\n\ufdd2c{i}\ufdd3<|im_end|>\n"
                    for i in range(n))
        out = sentinel_plan.__wrapped__(s, layout, tuple(range(1, n, 2)))
        assert len(out.ends) == n // 2 and out.target_error is None
        return out

    small, large = _lines_run(plan, 400), _lines_run(plan, 1600)
    assert large < 4.4 * small  # linear: 4x (a scan per reply: 16x)

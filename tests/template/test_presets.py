"""Each built-in preset: the exact rendered text and the exact trained tokens for one
conversation with a system message, two turns and a tool call."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sftdata.template import PRESETS, learn_profile, load_chat_template, render_conversation
from tests.helpers.templates import WEATHER_TOOL, conversation, preset_tokenizer

SCHEMA = json.dumps(WEATHER_TOOL)
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
CHATML_TOOLS = (
    "<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
    "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" + SCHEMA +
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n")
CHATML_BODY = (
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n" + CALL +
    "\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n")

EXPECTED = {
    "llama3": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.\n\nYou have access to the "
        "following functions. To call a function, respond with JSON of the form {\"name\": function name, "
        "\"parameters\": dictionary of argument name and its value}. Do not use variables.\n\n"
        + json.dumps(WEATHER_TOOL, indent=4) + "<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
        "<|start_header_id|>ipython<|end_header_id|>\n\n18C<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nIt is 18C.<|eot_id|>",
        ["Hello!<|eot_id|>", '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
         "It is 18C.<|eot_id|>"]),
    "chatml": (
        CHATML_TOOLS + CHATML_BODY + "It is 18C.<|im_end|>\n",
        ["Hello!<|im_end|>", "<tool_call>\n" + CALL + "\n</tool_call><|im_end|>", "It is 18C.<|im_end|>"]),
    "qwen3": (  # the final reply alone gets the (empty) think block
        CHATML_TOOLS + CHATML_BODY + "<think>\n\n</think>\n\nIt is 18C.<|im_end|>\n",
        ["Hello!<|im_end|>", "<tool_call>\n" + CALL + "\n</tool_call><|im_end|>",
         "<think>\n\n</think>\n\nIt is 18C.<|im_end|>"]),
    "mistral": (  # the system text and the tools go with the LAST user message
        "<s>[INST] Hi[/INST] Hello!</s>[AVAILABLE_TOOLS] [" + SCHEMA + "][/AVAILABLE_TOOLS]"
        "[INST] You are helpful.\n\nWeather in Paris?[/INST]"
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "c1"}]</s>'
        '[TOOL_RESULTS] {"content": "18C", "call_id": "c1"}[/TOOL_RESULTS] It is 18C.</s>',
        [" Hello!</s>", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "c1"}]</s>',
         " It is 18C.</s>"]),
    "gemma": (
        "<bos><start_of_turn>user\nYou are helpful.\n\nYou can call functions. To call one, write a Python call in a "
        "```tool_code``` block, for example:\n```tool_code\nname(argument=value)\n```\nThe functions:\n"
        + json.dumps([WEATHER_TOOL], indent=2) + "\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nWeather in Paris?<end_of_turn>\n"
        '<start_of_turn>model\n```tool_code\nget_weather(city="Paris")\n```<end_of_turn>\n'
        "<start_of_turn>user\n```tool_output\n18C\n```<end_of_turn>\n"
        "<start_of_turn>model\nIt is 18C.<end_of_turn>\n",
        ["Hello!<end_of_turn>", '```tool_code\nget_weather(city="Paris")\n```<end_of_turn>',
         "It is 18C.<end_of_turn>"]),
}


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def test_every_preset_is_tested():
    assert sorted(EXPECTED) == sorted(PRESETS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_text_and_trained_tokens(tmp_path, name):
    tok = preset_tokenizer(tmp_path, name)
    profile = learn_profile(load_chat_template(name), tok)
    out = render_conversation(conversation(), profile, tok)
    text, replies = EXPECTED[name]
    assert out.per_reply is None and len(out.episodes) == 1
    ep = out.episodes[0]
    assert ep.text == text
    # tokenized once, exactly as the whole text encodes (no BOS added, no special token split)
    assert ep.ids.tolist() == tok.encode_rendered(text).ids.tolist()
    # trained: each reply through its end-of-turn token, in three runs, nothing else
    assert [ep.ids[a:b].tolist() for a, b in runs(ep.mask)] == [tok.encode_rendered(r).ids.tolist() for r in replies]
    assert ep.rule_mismatch is None
    assert profile.arguments == "dict"
    assert profile.tools_supported


def test_qwen3_prefix_render_is_not_a_prefix_of_the_whole(tmp_path):
    """Why spans are found in the whole render: the render up to the first reply gives that
    reply a think block that the whole render does not have."""
    tok = preset_tokenizer(tmp_path, "qwen3")
    profile = learn_profile(load_chat_template("qwen3"), tok)
    out = render_conversation(conversation(), profile, tok)
    fn = profile.render_fn()
    msgs = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}]
    assert not out.episodes[0].text.startswith(fn(msgs))
    assert "<think>\n\n</think>\n\nHello!" in fn(msgs)

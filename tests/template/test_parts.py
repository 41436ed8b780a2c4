"""What a render must hold of a record (sftdata/template/parts.py): each reply's text, its
reasoning and calls in its span; each tool result in the render; each tool schema's name,
description and parameter names outside the replies' spans (a call writes its function's
name and argument names, which is not the schema)."""

from __future__ import annotations

import json

from sftdata.template.parts import missing_part, missing_reply_part

SCHEMA = {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
MESSAGES = [{"role": "user", "content": "Weather?"}, CALL, {"role": "tool", "content": "18C"},
            {"role": "assistant", "content": "It is 18C."}]


def render(schema_text: str) -> tuple[str, dict]:
    """A render with ``schema_text`` before the turns, and the replies' spans."""
    head = f"<s>{schema_text}<u>Weather?"
    call = '<c>get_weather {"city": "Paris"}</c>'
    text = head + call + "<r>18C<a>It is 18C.</a>"
    a = len(head)
    b = text.index("<r>")
    c = text.index("<a>") + 3
    return text, {1: (a, b), 3: (c, len(text))}


def test_a_whole_schema_outside_the_calls_is_held():
    text, spans = render("get_weather: The current weather in a city. (city)")
    assert missing_part(text, MESSAGES, spans, [SCHEMA]) is None


def test_a_schema_whose_name_and_parameters_appear_only_in_a_call_is_dropped():
    text, spans = render("")
    assert missing_part(text, MESSAGES, spans, [SCHEMA]) == ("template_drops_tools", "the tool schema 'get_weather'")


def test_a_schema_without_its_description_is_dropped():
    text, spans = render("get_weather(city)")
    assert missing_part(text, MESSAGES, spans, [SCHEMA]) == (
        "template_drops_tools", "the tool schema 'get_weather' (its description)")


def test_a_schema_without_a_parameter_name_is_dropped():
    schema = {"type": "function", "function": {**SCHEMA["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}}
    text, spans = render("get_weather: The current weather in a city.")
    assert missing_part(text, MESSAGES, spans, [schema]) == (
        "template_drops_tools", "the tool schema 'get_weather' (its parameter 'unit')")


def test_generation_blocks_look_for_the_schema_in_the_whole_render():
    text, _ = render("")
    assert missing_part(text, MESSAGES, {-1: (0, 0)}, [SCHEMA]) == (
        "template_drops_tools", "the tool schema 'get_weather' (its description)")


def _call_in(window: str, arguments) -> tuple[str, str] | None:
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_stock", "arguments": arguments}}]}
    return missing_reply_part(message, window, 1)


ARGS = {"symbol": "AAPL", "period": "1mo", "limit": 5, "adjusted": True, "note": None, "fields": ["open", "close"]}


def test_a_call_is_recognised_in_every_argument_encoding_a_template_writes():
    """JSON, GLM's XML-ish keys and values, pythonic calls (issue 41): every key and value
    of the arguments is found, whether given as a dict or as JSON text."""
    windows = {
        "json": '{"name": "get_stock", "arguments": {"symbol": "AAPL", "period": "1mo", "limit": 5, '
                '"adjusted": true, "note": null, "fields": ["open", "close"]}}',
        "xml": "get_stock<arg_key>symbol</arg_key><arg_value>AAPL</arg_value><arg_key>period</arg_key>"
               "<arg_value>1mo</arg_value><arg_key>limit</arg_key><arg_value>5</arg_value><arg_key>adjusted"
               "</arg_key><arg_value>true</arg_value><arg_key>note</arg_key><arg_value>null</arg_value>"
               '<arg_key>fields</arg_key><arg_value>["open", "close"]</arg_value>',
        "pythonic": "[get_stock(symbol='AAPL', period='1mo', limit=5, adjusted=True, note=None, "
                    "fields=['open', 'close'])]",
    }
    for encoding, window in windows.items():
        for arguments in (ARGS, json.dumps(ARGS)):
            assert _call_in(window, arguments) is None, encoding
    dropped = windows["xml"].replace("<arg_value>1mo</arg_value>", "<arg_value></arg_value>")
    assert _call_in(dropped, ARGS) == ("template_drops_tool_calls",
                                       "assistant message 1's call 'get_stock' (its argument text '1mo')")

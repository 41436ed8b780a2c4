"""The sandboxed Jinja environment renders as Hugging Face's does."""

from __future__ import annotations

from datetime import datetime

import pytest

pytest.importorskip("jinja2", reason="the hf extra (jinja2) is not installed")

from sftdata.errors import TemplateError  # noqa: E402
from sftdata.template import compile_template, has_generation_blocks, load_chat_template, render  # noqa: E402

MSGS = [{"role": "user", "content": "héllo \"x\" <b>"}, {"role": "assistant", "content": "ok"}]


def run(text: str, messages=MSGS, **kw):
    return render(compile_template(text, "t"), messages, name="t", **kw)


def test_trim_and_lstrip_blocks():
    text = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}"
    assert run(text).text == "[héllo \"x\" <b>]\n"


def test_tojson_keeps_non_ascii_and_does_not_escape_html():
    assert run("{{ messages[0] | tojson }}").text == '{"role": "user", "content": "héllo \\"x\\" <b>"}'
    assert run("{{ {'b': 1, 'a': [1]} | tojson(indent=2, sort_keys=True) }}").text == '{\n  "a": [\n    1\n  ],\n  "b": 1\n}'
    assert run("{{ messages[1] | tojson(separators=(',', ':')) }}").text == '{"role":"assistant","content":"ok"}'


def test_variables_and_helpers():
    text = ("{{ bos_token }}|{{ add_generation_prompt }}|{{ tools is none }}|{{ dict(a=1)['a'] }}|"
            "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}|"
            "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.content }}{% endfor %}")
    out = run(text, variables={"bos_token": "<s>"}, add_generation_prompt=True)
    assert out.text == "<s>|True|True|1|2|ok"
    assert run("{{ strftime_now('%Y') }}").text == str(datetime.now().year)


def test_raise_exception_names_the_template_and_its_message():
    with pytest.raises(TemplateError, match=r"^chat template t refused the conversation: Roles must alternate$"):
        run("{{ raise_exception('Roles must alternate') }}")


def test_undefined_use_and_python_errors_are_template_errors():
    with pytest.raises(TemplateError, match=r"^chat template t failed: UndefinedError: "):
        run("{{ messages[0].missing.deeper }}")
    with pytest.raises(TemplateError, match=r"^chat template t failed: TypeError: "):
        run("{{ messages[0].content + 1 }}")


def test_the_sandbox_refuses_mutation_and_internals():
    with pytest.raises(TemplateError, match=r"SecurityError: .*append"):
        run("{% set x = messages.append(1) %}")
    with pytest.raises(TemplateError, match=r"SecurityError: a template may not set the attribute '_x'"):
        run("{% set ns = namespace() %}{% set ns._x = 1 %}")
    assert run("{{ messages.__class__ }}").text == ""


def test_generation_blocks_become_character_spans():
    text = ("{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
            "</end>{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}")
    assert has_generation_blocks(text) and has_generation_blocks("{%- generation -%}")
    out = run(text)
    assert out.text == "<user>héllo \"x\" <b><assistant>ok</end>"
    ((a, b),) = out.generation
    assert out.text[a:b] == "ok</end>"
    assert run(text.replace("generation", "generation ")).generation == out.generation


def test_a_template_that_does_not_compile():
    with pytest.raises(TemplateError, match=r"^chat template bad.jinja does not compile: .*\(line 1\)"):
        compile_template("{% for m in messages %}", "bad.jinja")


def test_load_chat_template_sources(tmp_path):
    assert load_chat_template("chatml").source == "preset"
    f = tmp_path / "mine.jinja"
    f.write_text("{{ messages[0].content }}", encoding="utf-8")
    t = load_chat_template(str(f))
    assert (t.name, t.source, t.text) == ("mine.jinja", "file", "{{ messages[0].content }}")
    assert len(t.sha256) == 64 and t.state()["sha256"] == t.sha256
    with pytest.raises(TemplateError, match=r"'nope' is neither a preset \(chatml, gemma, llama3, mistral, qwen3\)"):
        load_chat_template("nope")
    with pytest.raises(TemplateError, match=r"ships no chat template; pass --chat-template"):
        load_chat_template("model")


def test_attribute_decisions_kept_per_type_are_jinjas_own_every_time():
    """The environment keeps the sandbox's answer per (type, attribute) for builtin types and
    Jinja's loop and namespace objects: a second and third render answer as the first, and
    as Jinja's own sandbox does (a dict's methods before its keys, a key otherwise)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    ours = compile_template("t", "t").environment
    theirs = ImmutableSandboxedEnvironment()
    ns = ours.globals["namespace"](a=1)
    cases = [({"a": 1}, "keys"), ({"a": 1}, "a"), ({"a": 1}, "pop"), ([1], "append"), ([1], "index"), ("s", "split"),
             ("s", "__class__"), ("s", "_x"), ({1}, "add"), ((1,), "count"), (1, "real"), (ns, "a"), (ns, "__class__")]
    for _ in range(3):
        for obj, attr in cases:
            try:
                value = getattr(obj, attr)
            except AttributeError:
                value = None
            assert ours.is_safe_attribute(obj, attr, value) == theirs.is_safe_attribute(obj, attr, value), (obj, attr)
    text = "{% for m in messages %}{{ m.content }}|{{ m.keys is defined }}|{{ m.missing is defined }}|{% endfor %}"
    for _ in range(3):
        assert run(text).text == 'héllo "x" <b>|True|False|ok|True|False|'
    with pytest.raises(TemplateError, match=r"SecurityError: .*pop"):
        run("{% set x = messages[0].pop('role') %}")
    assert run("{{ messages[0].items() | list | length }}").text == "2"


def test_getattr_and_calls_of_plain_values_are_jinjas_own_every_time():
    """A fixed type's attribute found safe is read at once, and a builtin method of a str,
    dict, list or tuple is called at once (in a loop too, where Jinja passes its loop
    variables along): every render, the text Jinja's own sandbox writes, and its refusals."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    theirs = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    text = ("{% for m in messages %}{{ m.content.split(' ')[0].strip('\"').upper() }}|{{ m.get('role') }}|"
            "{{ m.items() | list | length }}|{{ [1, 2].index(2) }}|{{ (3, 3).count(3) }}|{{ 'a{}'.format(m.role) }}|"
            "{{ '-'.join(m.keys()) }}|{{ m.content.startswith('ok') }}|{{ loop.index }}{% endfor %}"
            "{% macro f(x) %}[{{ x.lower() }}]{% endmacro %}{{ f('AB') }}{{ 'x'.rjust(3, '.') }}")
    want = theirs.from_string(text).render(messages=MSGS)
    assert want == "HÉLLO|user|2|1|2|auser|role-content|False|1OK|assistant|2|1|2|aassistant|role-content|True|2[ab]..x"
    for _ in range(3):
        assert run(text).text == want
    def jinjas(t):
        try:
            return theirs.from_string(t).render(messages=MSGS)
        except Exception as e:  # noqa: BLE001 - whatever Jinja raises, ours names it
            return type(e).__name__

    def ours(t):
        try:
            return run(t).text
        except TemplateError as e:
            return str(e).split(": ")[1]

    odd = ["{{ messages.append(1) }}", "{{ 'a'.__class__ }}|{{ 'a'._x is defined }}", "{{ messages[0].update({}) }}",
           "{{ '{0.__class__}'.format(1) }}", "{{ 'a'.split(1) }}", "{% for m in messages %}{{ m.pop() }}{% endfor %}"]
    want = [jinjas(t) for t in odd]
    assert want == ["SecurityError", "|False", "SecurityError", "", "TypeError", "SecurityError"]
    for _ in range(2):
        assert [ours(t) for t in odd] == want

"""Every render of a chat template runs under limits that are counts (steps, characters
built, output, call depth), so a hostile template ends in one TemplateLimitError naming it,
the same on every machine, and an ordinary template renders exactly as before."""

from __future__ import annotations

import pytest

pytest.importorskip("jinja2", reason="the hf extra (jinja2) is not installed")

from sftdata.errors import TemplateError, TemplateLimitError  # noqa: E402
from sftdata.template import PRESETS, TemplateLimits, compile_template, render  # noqa: E402
from sftdata.template.limits import (  # noqa: E402
    DEFAULT_MAX_STEPS,
    ITEM_CHARS,
    MAX_DEPTH,
    STEPS_PER_CHAR,
    Budget,
    conversation_size,
    weight,
)

MSGS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
SIZE = conversation_size(MSGS, None)  # 3 lists and dicts of 2 items, 27 characters
BUDGET = DEFAULT_MAX_STEPS + STEPS_PER_CHAR * SIZE
STEPS = (rf"chat template t ran past its budget of {BUDGET:,} steps \(--template-max-steps 100,000 \+ 8 per "
         rf"character of this conversation\): it loops, recurses or builds text without bound; raise "
         rf"--template-max-steps only for a template you trust$")


WALK = (rf"^chat template t would compare, hash or search more than [\d,]+ items in one step, more than the [\d,]+ "
        rf"steps left of its budget of {BUDGET:,} steps \(--template-max-steps 100,000 \+ 8 per character of this "
        rf"conversation\) pay for at 4 items a step \(a list that holds another many times is walked through every "
        rf"reference\); raise --template-max-steps only for a template you trust$")
TWINS = ("{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}"
         "{% set ns.b = [ns.b, ns.b] %}{% endfor %}")  # two lists equal item by item, each 2^64 items through references
TUPLES = "{% set ns = namespace(a=(1,)) %}{% for i in range(64) %}{% set ns.a = (ns.a, ns.a) %}{% endfor %}"
EACH = "{{% for i in range(100000) %}}{{% set x = {} %}}{{% endfor %}}"


def run(text: str, messages=MSGS, limits: TemplateLimits = TemplateLimits(), **kw):
    return render(compile_template(text, "t"), messages, name="t", limits=limits, **kw)


def one_step(size: str) -> str:
    return (rf"^chat template t would build about {size} characters in one step, more than the [\d,]+ steps left "
            rf"of its budget of {BUDGET:,} steps \(--template-max-steps 100,000 \+ 8 per character of this "
            rf"conversation\) pay for at 256 characters a step; raise --template-max-steps only for a template "
            rf"you trust$")


def built(size: str) -> str:
    return (rf"^chat template t would build more than 536,870,912 characters while rendering this conversation "
            rf"\({size} more, after [\d,]+; the limit is 8 x --template-max-output, by default 8 x "
            rf"--max-record-bytes\)$")


def test_the_conversation_size_counts_characters_and_items():
    # the list and two dicts of two items each, then the characters of keys and values
    assert SIZE == ITEM_CHARS * 3 * 3 + len("rolecontent") * 2 + len("userhiassistantok") == 183
    assert weight(MSGS) == (183, 3, 11)  # the list, two dicts, eight strings
    shared = ["x" * 100] * 10  # a reference counts every time: that is what its text costs
    assert weight(shared) == (10 * 100 + ITEM_CHARS * 11, 2, 11)
    assert weight(shared, limit=500)[0] > 500  # weighing stops past the limit


HOSTILE = [
    # the four of issue 32
    ("{{ 'x' * 10000000 }}", STEPS),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", STEPS),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
     rf"^chat template t nests calls more than {MAX_DEPTH} deep \(a macro that calls itself without end\?\)$"),
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
     one_step("16,777,216")),
    # the same growth by other means
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     one_step("16,777,216")),
    ("{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l * 2 %}{% endfor %}",
     one_step("16,777,216")),
    ("{{ 2 ** 100000000 }}", one_step("66,666,667")),
    ("{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
     one_step("[\\d,]+")),
    ("{{ 'x' | center(1000000000) }}", built("1,000,000,000")),
    ("{{ 'x'.center(1000000000) }}", built("1,000,000,000")),
    ("{{ 'x'.ljust(600000000) }}", built("600,000,000")),
    ("{{ 'x'.zfill(600000000) }}", built("600,000,000")),
    ("{{ ('\t' * 1000).expandtabs(1000000) }}", built("1,000,001,000")),
    ("{{ (1).to_bytes(1000000000, 'big') }}", built("1,000,000,000")),
    ("{{ '%1000000000d' % 1 }}", built("1,000,000,015")),
    ("{{ '%.1000000000f' % 1.0 }}", built("1,000,000,045")),
    ("{{ '{:>1000000000}'.format(1) }}", built("1,000,000,017")),
    ("{{ '%s' | format('x') | indent(600000000) }}", built("600,000,001")),
    ("{{ range(100000) | join('x' * 100000) }}", built("[\\d,]+")),
    ("{{ ('x' * 1000) | replace('', 'y' * 100000) }}", one_step("100,101,000")),
    ("{{ ('x' * 1000).replace('', 'y' * 100000) }}", one_step("100,101,000")),
    ("{{ ('x' * 100).translate({120: 'y' * 10000000}) }}", built("[\\d,]+")),
    ("{{ messages | tojson(indent=100000000) }}", built("[\\d,]+")),
    ("{{ [1] | batch(600000000, 'x') | list }}", built("600,000,016")),
    ("{{ [1] | slice(600000000) | list }}", built("600,000,016")),
    ("{{ lipsum(1000000) }}", built("1,600,000,000")),
    # a list holding one string many times: cheap to build, huge as text
    ("{% set a = ['x' * 10] %}" + "{% set a = [a, a, a, a, a, a, a, a, a, a] %}" * 8 + "{{ a }}", one_step("[\\d,]+")),
    ("{% set a = ['x' * 10] %}" + "{% set a = [a, a, a, a, a, a, a, a, a, a] %}" * 8 + "{{ a | string }}",
     one_step("[\\d,]+")),
    ("{% set a = ['x' * 10] %}" + "{% set a = [a, a, a, a, a, a, a, a, a, a] %}" * 8 + "{{ 'a' ~ a }}",
     one_step("[\\d,]+")),
    # work that builds nothing
    ("{% macro f(n) %}{% if n %}{% set a = f(n - 1) %}{% set b = f(n - 1) %}{% endif %}{% endmacro %}{{ f(40) }}",
     STEPS),
    ("{% macro f() %}{% for i in range(100000) %}" + "L" * 1000 + "{% endfor %}{% endmacro %}{% set x = f() %}",
     STEPS),
    ("{% for i in range(100000) %}{% for j in range(100000) if false %}{% endfor %}{% endfor %}", STEPS),
    ("{% for x in range(100000) recursive %}{{ loop(range(100000)) if loop.depth < 3 }}{% endfor %}", STEPS),
    ("{% set s = 'x' * 20000 %}{% for i in range(100000) %}{% if 'y' in s %}{% endif %}{% endfor %}", STEPS),
    ("{% set l = range(100000) | list %}{% for i in range(100000) %}{% set x = l | sort %}{% endfor %}", STEPS),
    ("{% set l = [[1] * 1000] * 1000 %}{{ l | sum(start=[]) | length }}", STEPS),
    # issue 45: comparing, hashing and searching lists that hold one list twice, 64 levels deep (2^64 items)
    (TWINS + "{{ ns.a == ns.b }}", WALK), (TWINS + "{{ ns.a != ns.b }}", WALK), (TWINS + "{{ ns.a < ns.b }}", WALK),
    (TWINS + "{{ ns.a in [ns.b] }}", WALK), (TWINS + "{{ ns.a not in [ns.b] }}", WALK),
    (TWINS + "{{ 1 < 2 in [ns.b] }}", WALK), (TWINS + "{{ ns.a is eq ns.b }}", WALK),
    (TWINS + "{{ ns.a is in [ns.b] }}", WALK), (TWINS + "{{ [ns.a] | select('in', [[ns.b]]) | list }}", WALK),
    (TWINS + "{{ [ns.b].index(ns.a) }}", WALK), (TWINS + "{{ [ns.b].count(ns.a) }}", WALK),
    (TWINS + "{% for x in [ns.a, ns.b] %}{{ loop.changed(x) }}{% endfor %}", WALK),
    (TWINS + "{{ [ns.a, ns.b] | unique | list }}", STEPS), (TWINS + "{{ [ns.a, ns.b] | sort }}", STEPS),
    (TUPLES + "{{ {ns.a: 1} }}", WALK), (TUPLES + "{{ {}[ns.a] is defined }}", WALK),
    (TUPLES + "{{ dict([(ns.a, 1)]) }}", WALK), (TUPLES + "{{ {}.get(ns.a) }}", WALK),
    (TUPLES + "{{ ns.a in {'a': 1} }}", WALK), (TUPLES + "{{ ns.a in {'a': 1}.keys() }}", WALK),
    # a format width or precision taken from a string: refused before the field is built
    ("{{ '{:{}}'.format('a', '999999999') }}", built("1,000,000,001")),
    ("{{ '{:{w}}'.format('a', w='999999999') }}", built("1,000,000,001")),
    ("{{ '{0:{1}{2}}'.format('a', '99999', '9999') }}", built("1,000,000,001")),
    ("{{ '{:9{}}'.format('a', '99999999') }}", built("1,000,000,001")),
    ("{{ '{:.{}f}'.format(1.0, '999999999') }}", built("1,000,000,042")),
    ("{{ '{a:{w}}'.format_map({'a': 'x', 'w': '999999999'}) }}", built("1,000,000,001")),
    ("{{ ('{:{}}' | safe).format('a', '999999999') }}", built("1,000,000,001")),
    ("{{ ('x' | safe).center(1000000000) }}", built("1,000,000,000")),
    # filters and searches over ranges: their work grows with the range
    (EACH.format("range(100000) | max"), STEPS), (EACH.format("range(100000) | min"), STEPS),
    (EACH.format("range(100000) | map('abs') | max"), STEPS), (EACH.format("'a' in range(100000)"), STEPS),
    (EACH.format("range(100000).count('a')"), STEPS), (EACH.format("range(100000) | unique | list"), STEPS),
]


@pytest.mark.parametrize("text,message", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_template_ends_in_one_line(text, message):
    with pytest.raises(TemplateLimitError, match=message) as e:
        run(text)
    assert "\n" not in str(e.value) and e.value.reason == "template_limit"


def test_a_breach_is_the_same_count_every_time():
    text = "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
    messages = [str(pytest.raises(TemplateLimitError, run, text).value) for _ in range(3)]
    assert messages == [messages[0]] * 3 and f"budget of {BUDGET:,} steps" in messages[0]


def test_the_budget_grows_with_the_conversation():
    # 1 + 80,000 items + 80,000 calls of range + 240,000 items: 400,001 steps
    loop = "{% for i in range(80000) %}{% for j in range(3) %}{% endfor %}{% endfor %}"
    with pytest.raises(TemplateLimitError, match=STEPS):
        run(loop)
    longer = [{"role": "user", "content": "x" * 40000}, {"role": "assistant", "content": "ok"}]
    assert run(loop, longer).text == ""  # 100,000 + 8 x 40,181 steps
    assert run(loop, limits=TemplateLimits(max_steps=400_000)).text == ""


def test_the_output_is_capped_as_it_grows():
    text = "{% for m in messages %}{{ m.content }}{% endfor %}" * 3
    assert run(text, limits=TemplateLimits(max_output=12)).text == "hiokhiokhiok"
    with pytest.raises(TemplateLimitError, match=r"^chat template t renders more than 11 characters for this "
                                                 r"conversation \(--template-max-output, by default "
                                                 r"--max-record-bytes\)$"):
        run(text, limits=TemplateLimits(max_output=11))
    with pytest.raises(TemplateLimitError, match=r"^chat template t would build more than 800 characters"):
        run("{{ ('x' * 500) ~ ('y' * 500) }}", limits=TemplateLimits(max_output=100))


def test_recursion_and_memory_that_python_itself_stops():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(TemplateLimitError, match=r"^chat template t recursed deeper than Python allows \(a macro "
                                                 r"that calls itself without end\?\)$"):
        run("{{ deep | tojson }}", variables={"deep": deep})

    def exhausted():
        raise MemoryError

    with pytest.raises(TemplateLimitError, match=r"^chat template t ran out of memory rendering this conversation$"):
        run("{{ boom() }}", variables={"boom": exhausted})
    with pytest.raises(TemplateError, match=r"^chat template deep does not compile: it nests expressions or blocks "
                                            r"too deeply for Python$"):
        compile_template("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "deep")


def test_a_template_too_long_to_compile_quickly_is_refused_unread():
    with pytest.raises(TemplateError, match=r"^chat template long is 262,145 characters, more than the 262,144 a chat "
                                            r"template may be \(the largest real ones are under 20,000\): it is "
                                            r"refused unread$"):
        compile_template("x" * (256 * 1024 + 1), "long")
    assert compile_template("x" * (256 * 1024), "long").render() == "x" * (256 * 1024)


def test_the_budget_is_out_of_a_templates_reach():
    assert run("{{ context }}|{{ budget }}|{{ self._TemplateReference__context }}").text == "||"
    with pytest.raises(TemplateError, match=r"^chat template t does not compile: "):
        run("{{ sftdata budget }}")  # its key is no name a template can write


ESCAPES = [  # what the security review tried: each renders nothing or is a SecurityError
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
    ("{{ cycler.__init__.__globals__ }}", "SecurityError"),
    ("{{ joiner.__init__.__globals__.os }}", "SecurityError"),
    ("{{ namespace.__init__.__globals__ }}", "SecurityError"),
    ("{{ (1).__class__.__base__.__subclasses__() }}", "SecurityError"),
    ("{{ dict.__call__.__globals__ }}", "SecurityError"),
    ("{{ messages.__class__.__name__ }}", "SecurityError"),
    ("{{ '{0.__class__.__mro__}'.format(1) }}", "SecurityError"),
    ("{% set x = messages.append(1) %}", "SecurityError"),
    ("{% set x = dict(a=1).update(b=2) %}", "SecurityError"),
    ("{% set ns = namespace() %}{% set ns._x = 1 %}", "SecurityError"),
    ("{{ lipsum.__globals__ }}", ""),
    ("{{ range.__self__ }}", ""),
    ("{{ self._TemplateReference__context }}", ""),
    ("{{ messages | attr('__class__') }}", ""),
    ("{{ raise_exception.__globals__ }}", ""),
    ("{{ '{0.__globals__}'.format(cycler.reset) }}", ""),
]


@pytest.mark.parametrize("text,refused", ESCAPES, ids=range(len(ESCAPES)))
def test_sandbox_escapes_stay_refused(text, refused):
    if not refused:
        assert run(text).text == ""
        return
    with pytest.raises(TemplateError, match=rf"^chat template t failed: {refused}: "):
        run(text)


ORDINARY = [
    ("{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% endfor %}", "1/2,2/2"),
    ("{% for m in messages | reverse %}{{ m.role[0] }}{% else %}none{% endfor %}", "au"),
    ("{% for m in [] %}x{% else %}none{% endfor %}", "none"),
    ("{% for k, v in {'a': 1, 'b': 2} | dictsort %}{{ k }}{{ v }}{% endfor %}", "a1b2"),
    ("{% for x in [[1, [2]], [3]] recursive %}{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}{% endif %}"
     "{% endfor %}", "123"),
    ("{% for m in messages if m.role == 'user' %}{{ m.content }}{% endfor %}", "hi"),
    ("{% macro h(r) %}<{{ r }}{{ caller() if caller }}>{% endmacro %}{% call h('x') %}!{% endcall %}{{ h('y') }}",
     "<x!><y>"),
    ("{{ messages | map(attribute='role') | join(', ') }}|{{ messages | selectattr('role', 'eq', 'user') | list "
     "| length }}", "user, assistant|1"),
    ("{{ 'a' ~ 1 ~ none }}|{{ 'x' * 3 }}|{{ [1] * 2 }}|{{ 2 ** 10 }}|{{ '%05d' % 42 }}|{{ '{:>4}'.format(7) }}",
     "a1None|xxx|[1, 1]|1024|00042|   7"),
    ("{{ messages[::-1][0].role }}|{{ 'abc'[1:] }}|{{ messages | tojson }}",
     'assistant|bc|[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]'),
    ("{{ ' x ' | trim | upper | center(5) }}|{{ [['a'], ['b']] | sum(start=[]) | join }}|"
     "{{ [[1], [2]] | sum(start=[]) }}", "  X  |ab|[1, 2]"),
    ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content | length %}{% endfor %}"
     "{{ ns.n }}", "4"),
    ("{{ 'hi' in messages[0].content }}|{{ messages[0].content == 'hi' }}|{{ 'x' is in 'xyz' }}|"
     "{{ messages | selectattr('content', 'in', ['ok']) | list | length }}", "True|True|True|1"),
]


@pytest.mark.parametrize("text,expected", ORDINARY, ids=range(len(ORDINARY)))
def test_an_ordinary_template_renders_exactly_as_jinja_does(text, expected):
    assert run(text).text == expected


def test_an_ordinary_render_takes_a_small_share_of_its_budget(monkeypatch):
    """Each preset, on 400 messages of almost nothing (the most steps per character), takes
    less than one step per character of the conversation; the budget allows 8."""
    seen: list[Budget] = []
    original = Budget.__init__

    def spy(self, *a, **k):
        original(self, *a, **k)
        seen.append(self)

    monkeypatch.setattr(Budget, "__init__", spy)
    many = [m for i in range(200) for m in ({"role": "user", "content": ""}, {"role": "assistant", "content": "k"})]
    size = conversation_size(many, None)
    used = {}
    for name, text in PRESETS.items():
        render(compile_template(text, name), many, variables={"bos_token": "<s>", "eos_token": "</s>"}, name=name)
        used[name] = seen[-1].steps - seen[-1].left
    assert max(used.values()) < size, (used, size)


def test_ordinary_comparisons_keys_and_formats_render_as_before():
    text = ("{{ '{:>5}|{:.2f}|{:,}'.format('ab', 3.14159, 1234567) }}|{{ '{:{}}'.format('a', '3') }}|"
            "{{ 3 in range(10) }}{{ 'x' in {'x': 1} }}{{ (1, 2) in [(1, 2)] }}{{ [1] not in [[1]] }}|"
            "{{ {(1, 2): 'v'}[(1, 2)] }}{{ {'k': 'w'}[messages[0].role[:0] ~ 'k'] }}|"
            "{{ ('<{}>' | safe).format('&') }}{{ [messages[0]].index(messages[0]) }}{{ messages == messages }}")
    assert run(text).text == "   ab|3.14|1,234,567|a  |TrueTrueTrueFalse|vw|<&amp;>0True"


def test_a_walk_costs_one_step_per_four_items_and_256_characters():
    b = Budget("t", TemplateLimits(max_steps=1000), 0)
    b.walk([["x" * 100] * 10] * 10)  # 111 values, 10,000 characters and 110 items of 16
    assert b.steps - b.left == 111 // 4 + (10_000 + 16 * 121) // 256 == 73
    with pytest.raises(TemplateLimitError, match=r"^chat template t would compare, hash or search more than 3,708 "
                                                 r"items in one step, more than the 927 steps left"):
        b.walk([list(range(10))] * 10_000)

"""The filters, comparison tests and ``lipsum`` a template calls, each wrapped to pay from
the render's budget (``limit_callables``, once the environment's own are registered):

    sort, unique, groupby, min, max, sum   the input's weight, before (``_REDUCING``)
    string, upper, indent, replace, ...    a non-string input's text, before (``_STRINGIFYING``)
    center, indent, wordwrap, join, ...    the size the filter would build, from its arguments (``_PREDICTED``)
    every filter                           the result's size, after
    == < in and the like as tests          the operands walked first (``_COMPARISON_TESTS``)
    lipsum                                 paragraphs x words, before

They take the context (``pass_context``), so Jinja's optimizer never runs them at compile
time, outside any budget.
"""

from __future__ import annotations

from .limits import BUILD_CHARS, format_size, replace_size, shallow, text_size
from .sandbox import CHARGE_FILTER, LOOP_FILTER, NUMBERS, budget_of, result_size, text_len, walk

# filters whose work grows with their whole input (sorting, reducing), charged by its weight
_REDUCING = frozenset({"sort", "unique", "dictsort", "groupby", "min", "max", "sum"})
# filters that turn their input into text first: a list is weighed before it is
_STRINGIFYING = frozenset({"string", "safe", "e", "escape", "forceescape", "trim", "upper", "lower", "title",
                           "capitalize", "striptags", "urlize", "wordcount", "truncate", "wordwrap", "center",
                           "indent", "replace", "format", "urlencode", "xmlattr", "reverse"})
_COMPARISON_TESTS = frozenset({"in", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt",
                               "greaterthan", ">", "ge", ">="})


def _arg(args: tuple, kwargs: dict, i: int, name: str, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _int(value, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _width(value) -> int:
    return len(value) if isinstance(value, str) else max(0, _int(value))


def _lines(value, b) -> int:
    return value.count("\n") + 1 if isinstance(value, str) else text_size(value, b)


def _wordwrap_size(v, a, k, b) -> int:
    n = text_len(v, b)
    width = max(1, _int(_arg(a, k, 0, "width", 79), 1))
    return n + (n // width + 1) * _width(_arg(a, k, 2, "wrapstring") or "\n")


def _replace_size(v, a, k, b) -> int:
    old, new, count = _arg(a, k, 0, "old", ""), _arg(a, k, 1, "new", ""), _arg(a, k, 2, "count")
    if isinstance(v, str):
        return replace_size(v, old, new, count)
    n = text_len(v, b)
    return n + (n + 1) * shallow(new)


def _join_size(v, a, k, b) -> int:
    sep = text_len(_arg(a, k, 0, "d", ""), b)
    if isinstance(v, str):
        return len(v) * (1 + sep)
    return sum(text_size(x, b) for x in v) + len(v) * sep if isinstance(v, (list, tuple)) else 1


def _json_size(v, a, k, b) -> int:
    w, depth = b.weigh(v)
    return (12 if _arg(a, k, 0, "ensure_ascii", False) else 3) * w + w * depth * _width(_arg(a, k, 1, "indent"))


def _pprint_size(v, a, k, b) -> int:
    w, depth = b.weigh(v)
    return 4 * w + w * depth


# what a filter would build, from its arguments (the filter's own signature after the value)
_PREDICTED = {
    "center": lambda v, a, k, b: max(text_len(v, b), _int(_arg(a, k, 0, "width", 80))),
    "indent": lambda v, a, k, b: text_len(v, b) + _lines(v, b) * _width(_arg(a, k, 0, "width", 4)),
    "wordwrap": _wordwrap_size,
    "replace": _replace_size,
    "format": lambda v, a, k, b: format_size(v, k or a, b),
    "batch": lambda v, a, k, b: shallow(v) + (_int(_arg(a, k, 0, "linecount"))
                                                if _arg(a, k, 1, "fill_with") is not None else 0),
    "slice": lambda v, a, k, b: shallow(v) + _int(_arg(a, k, 0, "slices")),
    "join": _join_size,
    "tojson": _json_size,
    "pprint": _pprint_size,
}


def _call_with(func, pass_arg, _PassArg, context, *args, **kwargs):
    if pass_arg is _PassArg.context:
        return func(context, *args, **kwargs)
    if pass_arg is _PassArg.eval_context:
        return func(context.eval_ctx, *args, **kwargs)
    if pass_arg is _PassArg.environment:
        return func(context.environment, *args, **kwargs)
    return func(*args, **kwargs)


def _limited_filter(name: str, func, jinja2):
    _PassArg = jinja2.utils._PassArg
    pass_arg = _PassArg.from_obj(func)
    predicted = _PREDICTED.get(name)

    @jinja2.pass_context
    def limited(context, value, *args, **kwargs):
        b = budget_of(context)
        if (name in ("join", "sum") and not isinstance(value, (list, tuple, str))) or \
                (name in _REDUCING and not isinstance(value, (list, tuple, dict, str))):
            value = list(value)  # a range or generator: made a list, weighed once, then given to the filter
            b.build(shallow(value))
        if name in _REDUCING and isinstance(value, (list, tuple, dict)):
            b.charge(b.weigh(value)[0] // BUILD_CHARS)
            start = _arg(args, kwargs, 1, "start", 0)
            if name == "sum" and isinstance(start, (list, tuple, str)):  # sums of lists copy each partial sum
                b.charge(len(value) * (shallow(start) + sum(shallow(x) for x in value)) // BUILD_CHARS)
        if name in _STRINGIFYING and not isinstance(value, str):
            b.afford(text_size(value, b))
        if predicted is not None:
            b.afford(predicted(value, args, kwargs, b))
        result = _call_with(func, pass_arg, _PassArg, context, value, *args, **kwargs)
        b.build(result_size(result))
        return result

    limited.__name__ = getattr(func, "__name__", name)
    return limited


def _limited_test(func, jinja2):
    _PassArg = jinja2.utils._PassArg
    pass_arg = _PassArg.from_obj(func)

    @jinja2.pass_context
    def limited(context, value, *args, **kwargs):
        b = budget_of(context)
        steps = 1
        for operand in (value, *args):
            t = type(operand)
            if t is str:
                steps += len(operand) // BUILD_CHARS
            elif t not in NUMBERS and operand is not None:
                walk(b, operand)
        b.charge(steps)
        return _call_with(func, pass_arg, _PassArg, context, value, *args, **kwargs)

    limited.__name__ = getattr(func, "__name__", "test")
    return limited


def limit_callables(env) -> None:
    """Wrap every filter, the comparison tests and ``lipsum`` of ``env`` (after the
    environment's own filters and globals are registered)."""
    import jinja2
    import jinja2.utils

    for name, func in list(env.filters.items()):
        if name not in (LOOP_FILTER, CHARGE_FILTER):
            env.filters[name] = _limited_filter(name, func, jinja2)
    for name in _COMPARISON_TESTS & set(env.tests):
        env.tests[name] = _limited_test(env.tests[name], jinja2)
    lipsum = env.globals.get("lipsum")
    if lipsum is not None:
        @jinja2.pass_context
        def limited_lipsum(context, n=5, html=True, min=20, max=100):  # noqa: A002 - Jinja's own names
            budget_of(context).afford(_int(n) * _int(max) * 16)
            return lipsum(n, html, min, max)
        env.globals["lipsum"] = limited_lipsum

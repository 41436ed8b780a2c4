"""Jinja's immutable sandbox with every costly thing a template can do routed through the
render's ``Budget`` (``limits``):

    {% for %} items            the iterable wrapped at compile time (``sftdata_loop``)
    macros, call blocks        their literal text charged at each call (``sftdata_charge``)
    calls                      ``call``: depth, the receiver's size, the result's size
    + * ** %                   ``intercepted_binops``: predicted size, then the result's
    ~                          ``visit_Concat`` -> ``limited_concat``
    {{ value }}                ``finalize``
    slices                     ``limited_slice``
    == < in, keys, subscripts  compared, hashed or searched values walked first
                               (``limited_size``, ``limited_in``, ``limited_key``)
    str.format                 each field's final width checked (``LimitedFormatter``)
    filters, comparison tests  each one wrapped (``filters.limit_callables``)

jinja2 (an extra) is imported when the class is built: ``LimitedEnvironment``,
``LimitedCodeGenerator`` and ``LimitedFormatter`` are written here without it, and
``limited_environment_class`` puts each before Jinja's own class.
"""

from __future__ import annotations

import types
from functools import lru_cache

from ..errors import TemplateLimitError
from .limits import (
    BUDGET_KEY,
    BUILD_CHARS,
    WALK_ITEMS,
    WRITE_CHARS,
    Budget,
    binop_size,
    field_size,
    method_size,
    shallow,
    text_size,
)

LOOP_FILTER = "sftdata_loop"
CHARGE_FILTER = "sftdata_charge"
_TEXT = (str, bytes)
NUMBERS = frozenset({int, float, bool})
_SMALL = 1 << 16  # a result this small is paid for after it is built
# Builtin types whose attributes' safety is a function of (type, name) alone: the sandbox's
# answer for them is kept (it asks isinstance of fixed types and of abc classes these
# types' relations to cannot change; Jinja's loop and namespace objects, and the
# environment's own namespace class, are added to them), saving a quarter of a render's time.
_FIXED_TYPES = frozenset({str, dict, list, tuple, int, float, bool, type(None)})
_DICT_NAMES = frozenset(dir(dict))  # a plain dict's attributes: any other name is a key or undefined
_FORMATS = frozenset({"format", "format_map"})  # the str methods Jinja's sandbox wraps
_PLAIN_RECEIVERS = frozenset({str, dict, list, tuple})  # whose builtin methods are called directly (``call``)
_WALKED = (list, tuple, dict, set, frozenset)  # compared or hashed item by item, through every reference
_HASHED = (dict, set, frozenset, type({}.keys()), type({}.items()))  # ``in`` hashes the item, walks nothing else
_JINJA_KWARGS = frozenset({"_loop_vars", "_block_vars"})  # Jinja's own, dropped before the call
_SEARCHING = frozenset({"index", "count"})  # list, tuple and range methods that compare their argument with each item


def budget_of(context) -> Budget:
    budget = context.parent.get(BUDGET_KEY)  # the render's variables (a derived context's too)
    if budget is None:
        raise TemplateLimitError("a chat template was rendered without sftdata's limits (render it with "
                                 "sftdata.template.render)")
    return budget


def result_size(value) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() // 3
    return shallow(value)


def text_len(value, b) -> int:
    return len(value) if isinstance(value, str) else text_size(value, b)


def _literal_chars(body, nodes) -> int:
    """The literal text a block writes each time it runs (nested loops, macros and call
    blocks are charged by themselves)."""
    total = 0
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, nodes.TemplateData):
            total += len(node.data)
        elif isinstance(node, nodes.For):
            stack.extend(node.else_)
        elif not isinstance(node, (nodes.Macro, nodes.CallBlock)):
            stack.extend(node.iter_child_nodes())
    return total


def instrument(template, nodes) -> None:
    """Charge every loop item and every macro or call-block call (the parsed ``template``, in place)."""
    def charged(expr, cost: int):
        return nodes.Filter(expr, LOOP_FILTER, [nodes.Const(cost)], [], None, None, lineno=expr.lineno)

    for loop in list(template.find_all(nodes.For)):
        cost = 1 + _literal_chars(loop.body, nodes) // WRITE_CHARS
        loop.iter = charged(loop.iter, cost)
        if loop.recursive:  # loop(children): the items of each level too
            for call in list(loop.find_all(nodes.Call)):
                if isinstance(call.node, nodes.Name) and call.node.name == "loop" and call.args:
                    call.args[0] = charged(call.args[0], cost)
    for scope in list(template.find_all((nodes.Macro, nodes.CallBlock))):
        cost = 1 + _literal_chars(scope.body, nodes) // WRITE_CHARS
        charge = nodes.Filter(nodes.Const(None), CHARGE_FILTER, [nodes.Const(cost)], [], None, None,
                              lineno=scope.lineno)
        scope.body.insert(0, nodes.ExprStmt(charge, lineno=scope.lineno))


def walk(b: Budget, value) -> None:
    """Pay for comparing or hashing ``value`` (``Budget.walk``); a number or short string is free."""
    t = type(value)
    if t is str:
        if len(value) >= BUILD_CHARS:
            b.charge(len(value) // BUILD_CHARS)
    elif isinstance(value, _WALKED):
        b.walk(value)
    elif isinstance(value, range):
        b.charge(len(value) // WALK_ITEMS)
    elif isinstance(value, (str, bytes)):
        b.charge(len(value) // BUILD_CHARS)


@lru_cache(maxsize=1)
def limited_environment_class():
    """``ImmutableSandboxedEnvironment`` spending each render's budget: the classes below put
    before Jinja's own (jinja2 is imported here, once)."""
    import jinja2
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator, operators, optimizeconst
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
    from markupsafe import Markup

    for func in (finalize, charge, loop_items):  # they take the render's context (the budget's holder)
        jinja2.pass_context(func)
    generator = type("LimitedCodeGenerator", (LimitedCodeGenerator, CodeGenerator), {
        "nodes": nodes, "operators": operators,
        **{name: optimizeconst(vars(LimitedCodeGenerator)[name]) for name in LimitedCodeGenerator.OPTIMIZED}})
    formatter = type("LimitedFormatter", (LimitedFormatter, SandboxedFormatter), {})
    return type("LimitedEnvironment", (LimitedEnvironment, ImmutableSandboxedEnvironment), {
        "code_generator_class": generator,
        "fixed_types": _FIXED_TYPES | {jinja2.runtime.LoopContext, jinja2.utils.Namespace},
        "unwalked": (jinja2.runtime.Macro, jinja2.runtime.LoopContext),  # they pass their arguments on untouched
        "formatter": formatter,
        "escape_formatter": type("LimitedEscapeFormatter", (formatter, SandboxedEscapeFormatter), {}),
        "markup": Markup,
    })


def finalize(context, value):
    """``{{ value }}``: its text written (and built first when it is not a string)."""
    b = budget_of(context)
    if isinstance(value, str):
        b.write(len(value))
        return value
    size = text_size(value, b)  # str() of it builds the text
    b.afford(size)
    b.build(size)
    b.write(size)
    return value


def charge(context, _value, cost):
    """``CHARGE_FILTER``: a macro's or call block's literal text, at each call."""
    budget_of(context).charge(cost)
    return ""


def loop_items(context, iterable, cost):
    """``LOOP_FILTER``: a loop's items, each charged as it is made."""
    b = budget_of(context)
    for item in iterable:
        b.charge(cost)
        yield item


class LimitedCodeGenerator:
    """Jinja's ``CodeGenerator`` (after this class in the built one) writing calls to the
    environment's ``limited_*`` methods where a template concatenates, compares, hashes a key
    or slices; the ``OPTIMIZED`` visitors are wrapped in Jinja's ``optimizeconst`` there, and
    ``nodes`` and ``operators`` are Jinja's."""

    OPTIMIZED = ("visit_Concat", "visit_Compare", "visit_Dict", "visit_Getitem")
    nodes = operators = None  # jinja2's, set on the built class

    def visit_Template(self, node, frame=None):
        instrument(node, self.nodes)
        node.set_environment(self.environment)
        super().visit_Template(node, frame)

    def visit_Concat(self, node, frame):
        self.write("environment.limited_concat(context, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def _sized(self, node, frame):
        if isinstance(node, self.nodes.Const):
            self.visit(node, frame)
            return
        self.write("environment.limited_size(context, ")
        self.visit(node, frame)
        self.write(")")

    def visit_Compare(self, node, frame):
        if len(node.ops) == 1 and node.ops[0].op in ("in", "notin"):  # what is searched decides the cost
            self.write("(not " if node.ops[0].op == "notin" else "(")
            self.write("environment.limited_in(context, ")
            self.visit(node.expr, frame)
            self.write(", ")
            self.visit(node.ops[0].expr, frame)
            self.write("))")
            return
        self.write("(")
        self._sized(node.expr, frame)
        for op in node.ops:
            self.write(f" {self.operators[op.op]} ")
            self._sized(op.expr, frame)
        self.write(")")

    def _key(self, node, frame):
        if isinstance(node, self.nodes.Const):
            self.visit(node, frame)
            return
        self.write("environment.limited_key(context, ")
        self.visit(node, frame)
        self.write(")")

    def visit_Dict(self, node, frame):
        self.write("{")
        for idx, item in enumerate(node.items):
            self.write(", " if idx else "")
            self._key(item.key, frame)
            self.write(": ")
            self.visit(item.value, frame)
        self.write("}")

    def visit_Getitem(self, node, frame):
        if not isinstance(node.arg, self.nodes.Slice):
            if isinstance(node.arg, self.nodes.Const):
                return super().visit_Getitem(node, frame)
            self.write("environment.getitem(")
            self.visit(node.node, frame)
            self.write(", ")
            self._key(node.arg, frame)
            self.write(")")
            return
        self.write("environment.limited_slice(context, ")
        super().visit_Getitem(node, frame)
        self.write(")")


class LimitedFormatter:
    """Jinja's sandboxed formatter (after this class in the built one) that refuses a field
    whose final spec (widths taken from arguments substituted) would build more than the
    budget allows, before it is built."""

    def __init__(self, env, budget, **kwargs):
        self._budget = budget
        super().__init__(env, **kwargs)

    def format_field(self, value, format_spec):
        self._budget.afford(field_size(value, format_spec, self._budget))
        return super().format_field(value, format_spec)


class LimitedEnvironment:
    """Jinja's ``ImmutableSandboxedEnvironment`` (after this class in the built one) with
    every operator, call, concatenation, comparison, key and slice paid from the render's
    budget. The built class sets ``code_generator_class``, ``fixed_types``, ``unwalked``,
    ``formatter``, ``escape_formatter`` and ``markup`` (Jinja's and markupsafe's)."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, **kwargs):
        super().__init__(finalize=finalize, **kwargs)
        self.safe_attributes: dict = {}
        self.filters[LOOP_FILTER] = loop_items
        self.filters[CHARGE_FILTER] = charge

    def is_safe_attribute(self, obj, attr, value):
        kind = type(obj)
        if kind not in self.fixed_types:
            return super().is_safe_attribute(obj, attr, value)
        key = (kind, attr)
        ok = self.safe_attributes.get(key)
        if ok is None:
            ok = super().is_safe_attribute(obj, attr, value)
            if len(self.safe_attributes) < 4096:
                self.safe_attributes[key] = ok
        return ok

    def getattr(self, obj, attribute):
        """Jinja's ``getattr`` (the attribute first, then the item), without raising and
        catching ``AttributeError`` for a plain dict's keys (``message.content``), and
        at once for an attribute of a fixed type already found safe (``str.split``):
        what Jinja's returns (it wraps only ``format`` and ``format_map``)."""
        kind = type(obj)
        if kind is dict and attribute not in _DICT_NAMES:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        if self.safe_attributes.get((kind, attribute)) and attribute not in _FORMATS:
            try:
                return getattr(obj, attribute)
            except AttributeError:
                pass
        return super().getattr(obj, attribute)

    def call_binop(self, context, operator, left, right):
        b = budget_of(context)
        if operator == "+" and type(left) is str and type(right) is str and \
                len(left) + len(right) < _SMALL:  # the usual case, paid after the fact
            out = left + right
            b.built += len(out)
            b.left -= 1 + len(out) // BUILD_CHARS
            if b.left < 0 or b.built > b.max_built:
                b.build(0)  # raises the breach
            return out
        if operator != "*" and operator != "**" and type(left) in NUMBERS and type(right) in NUMBERS:
            b.charge(1)  # + and % of numbers: a small result
            return self.binop_table[operator](left, right)
        b.afford(binop_size(operator, left, right, b))
        result = self.binop_table[operator](left, right)
        b.build(result_size(result))
        return result

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - the sandbox's own signature
        b = budget_of(__context)
        method = getattr(__obj, "__wrapped__", __obj)  # str.format behind the sandbox's wrapper
        receiver = method.__self__ if isinstance(method, types.BuiltinMethodType) or \
            (isinstance(method, types.MethodType) and isinstance(method.__self__, str)) else None  # Markup's
        if receiver is not None and not isinstance(receiver, types.ModuleType):
            name = method.__name__
            if name == "join" and isinstance(receiver, _TEXT) and args and \
                    not isinstance(args[0], (list, tuple, str)):
                args = (list(args[0]),) + args[1:]  # weighed once, then joined
            if name in _SEARCHING and isinstance(receiver, (list, tuple, range)):
                walk(b, receiver)
            else:
                b.charge(shallow(receiver) // BUILD_CHARS)
            size = method_size(name, receiver, args, kwargs, b)
            if size is not None:
                b.afford(size)
        if not isinstance(__obj, __self.unwalked):  # a builtin may hash or compare its arguments (dict(), .get(k))
            for value in (*args, *(v for k, v in kwargs.items() if k not in _JINJA_KWARGS)):
                if isinstance(value, _WALKED):
                    b.walk(value)
        b.enter()
        try:
            if receiver is not None and name in _FORMATS and isinstance(receiver, str):
                result = __self.limited_format(b, receiver, name, args, kwargs)
            elif receiver is not None and method is __obj and type(receiver) in _PLAIN_RECEIVERS and \
                    name not in _FORMATS:
                # a builtin method of a str, dict, list or tuple (getattr found it safe): Jinja's
                # sandbox and Context.call would only drop the loop and block variables and call it
                kwargs.pop("_loop_vars", None)
                kwargs.pop("_block_vars", None)
                result = __obj(*args, **kwargs)
            else:
                result = super().call(__context, __obj, *args, **kwargs)
        finally:
            b.depth -= 1
        b.build(result_size(result))
        return result

    def limited_format(self, b, receiver, name, args, kwargs):
        """``str.format`` / ``format_map`` as Jinja's sandbox runs them, each field's final
        spec checked before the field is built (``LimitedFormatter``)."""
        kwargs.pop("_loop_vars", None)
        kwargs.pop("_block_vars", None)
        if isinstance(receiver, self.markup):
            formatter = self.escape_formatter(self, b, escape=receiver.escape)
        else:
            formatter = self.formatter(self, b)
        if name == "format_map":
            if kwargs:
                raise TypeError("format_map() takes no keyword arguments")
            if len(args) != 1:
                raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
            args, kwargs = (), args[0]
        return type(receiver)(formatter.vformat(receiver, args, kwargs))

    def limited_concat(self, context, values):
        b = budget_of(context)
        b.afford(sum(text_len(v, b) for v in values))
        out = "".join(map(str, values))
        b.build(len(out))
        return out

    def limited_slice(self, context, value):
        budget_of(context).build(shallow(value))
        return value

    def limited_size(self, context, value):
        """A compared value, walked first (``walk``)."""
        t = type(value)
        if (t is str and len(value) < BUILD_CHARS) or t in NUMBERS or value is None:
            return value
        walk(budget_of(context), value)
        return value

    def limited_key(self, context, key):
        """A subscript or dict key, hashed: walked first (a tuple of tuples hashes every item)."""
        if type(key) is str or type(key) is int:
            return key
        walk(budget_of(context), key)
        return key

    def limited_in(self, context, item, container):
        """``item in container``, paid first: a dict or set hashes ``item``, a list or
        tuple compares it with each item (walked), a string searches it, a range holds an
        int at once and compares anything else with each of its items."""
        if type(item) is str and len(item) < BUILD_CHARS and type(container) is dict:
            return item in container  # the usual ``'content' in message``: one short hash
        b = budget_of(context)
        if isinstance(container, (str, bytes)):
            n = len(container) + (len(item) if isinstance(item, (str, bytes)) else 0)
            if n >= BUILD_CHARS:
                b.charge(n // BUILD_CHARS)
        elif isinstance(container, _HASHED):
            walk(b, item)
        elif isinstance(container, range):
            if type(item) is not int and type(item) is not bool:
                b.charge(len(container) // WALK_ITEMS)
        elif isinstance(container, (list, tuple)):
            b.walk(container)
        elif isinstance(container, type({}.values())):
            b.walk(list(container))
        else:  # a namespace, a generator (its items paid as made), undefined
            walk(b, item)
        return item in container

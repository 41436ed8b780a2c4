"""The limits an untrusted chat template renders under: counts, never a clock, so a record
is kept or rejected alike on a fast machine and a slow one.

Time: each render of a conversation gets a budget of *steps*::

    steps = max_steps + STEPS_PER_CHAR * size      size: the characters of the messages and
                                                   tools rendered (keys and values), plus
                                                   ITEM_CHARS per message, key and list item

spent as the template runs:

======================================  =================================================
a ``{% for %}`` iteration                1, plus 1 per WRITE_CHARS of literal text its body
                                         writes (a macro or call block: the same per call)
``{{ value }}``                          1 per WRITE_CHARS of the value (what is written is
                                         what is tokenized: the costly part of a record)
a call, filter, test, ``+ * ** %``,      1, plus 1 per BUILD_CHARS of what it builds (a
``~``, a slice                           list, tuple or dict item counts ITEM_CHARS), of the
                                         string or list a method belongs to, and of the
                                         input of filters that sort or reduce
a compared, hashed or searched value     1 per BUILD_CHARS of it and per WALK_ITEMS items,
(``== < in``, a dict key, a subscript,   walked through every reference (``Budget.walk``),
``list.index``, a builtin's argument)    before the operation runs; a range searched for
                                         what is not an int: 1 per WALK_ITEMS of its items
a filter that sorts or reduces a range   the range made a list first, then weighed
or a generator
======================================  =================================================

A ``str.format`` field's width and precision are read from its final spec (one taken from
an argument too: ``'{:{}}'.format('a', '999999999')``) and refused before it is built.

Memory: the text a render returns is at most ``max_output`` characters, and all it builds
on the way (every string and list an operation makes) at most ``BUILT_PER_OUTPUT`` times
that, so ``--max-record-bytes`` (the default ``max_output``) bounds a render as it bounds
a record (docs/CLI.md, "Memory"). Operations that could allocate without bound in one
step (``'x' * n``, ``n ** m``, ``center(n)``, ``'%9999999d'``, ``replace``, ``join``,
``tojson(indent=n)``, a list that holds one string many times turned into text ...) are
refused *before* they run when their predicted size breaks either limit. Calls nest at
most ``MAX_DEPTH`` deep (a macro that calls itself ends there, on every machine alike,
before Python's own recursion limit). Each breach is a ``TemplateLimitError`` naming the
template.

This module is pure Python; ``sandbox`` builds the Jinja classes that spend a ``Budget``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import TemplateLimitError
from ..sources import DEFAULT_MAX_RECORD_BYTES

DEFAULT_MAX_STEPS = 100_000
STEPS_PER_CHAR = 8  # the budget's allowance per character of the conversation
WRITE_CHARS = 4  # characters written per step
BUILD_CHARS = 256  # characters built per step
ITEM_CHARS = 16  # what a list, tuple or dict item counts (its pointer and object, and its cost to walk)
BUILT_PER_OUTPUT = 8  # everything a render builds: at most this times max_output
WALK_ITEMS = 4  # container items weighed per step (turning a list into text walks every item)
MAX_DEPTH = 48  # nested calls; each costs about 8 Python frames of the 1000 Python allows
# a template's text: the largest real ones are about 17,000 characters; compiling costs about
# 13 s and 250 MB per million characters, so this one bounds compiling to seconds
MAX_TEMPLATE_CHARS = 256 * 1024
#: the render's key for its budget: not an identifier, so no template can name it
BUDGET_KEY = "sftdata budget"
_CONTAINERS = (list, tuple, dict, set, frozenset)


@dataclass(frozen=True)
class TemplateLimits:
    """The limits of one run (``--template-max-steps``, ``--template-max-output``)."""

    max_steps: int = DEFAULT_MAX_STEPS
    max_output: int = DEFAULT_MAX_RECORD_BYTES

    def steps_for(self, size: int) -> int:
        """The budget of a render of a conversation of ``size`` (``conversation_size``)."""
        return self.max_steps + STEPS_PER_CHAR * size

    def recorded(self) -> dict:
        """What ``dataset_metadata.json`` records (``options.template_limits``)."""
        return {"max_steps": self.max_steps, "steps_per_char": STEPS_PER_CHAR, "write_chars_per_step": WRITE_CHARS,
                "build_chars_per_step": BUILD_CHARS, "item_chars": ITEM_CHARS, "max_depth": MAX_DEPTH,
                "max_output": self.max_output, "max_built": BUILT_PER_OUTPUT * self.max_output}


DEFAULT_LIMITS = TemplateLimits()


def weight(value, limit: float = float("inf"), max_items: float = float("inf")) -> tuple[int, int, int]:
    """``(size, depth, items)`` of a value: the characters of its strings plus ITEM_CHARS
    per container item, counted through every reference (a list holding one string ten
    times weighs ten strings: that is what turning it into text costs), how deep it nests,
    and how many values were visited. Stops once ``size`` passes ``limit`` or ``items``
    passes ``max_items``, so a value built to be huge costs no more than that to weigh."""
    total, deepest, items = 0, 0, 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        items += 1
        if items > max_items:
            return max(total, int(min(limit, 1 << 62)) + 1), deepest, items
        deepest = max(deepest, d)
        if isinstance(v, (str, bytes)):
            total += len(v)
            continue
        if isinstance(v, bool) or v is None or isinstance(v, float):
            total += 1
            continue
        if isinstance(v, int):
            total += v.bit_length() // 3 + 1
            continue
        if isinstance(v, (list, tuple, set, frozenset)):
            pairs = None
        elif isinstance(v, dict):
            pairs = v
        else:
            try:  # a Jinja namespace() keeps its attributes here
                pairs = object.__getattribute__(v, "_Namespace__attrs")
            except AttributeError:
                total += 1
                continue
        total += ITEM_CHARS * (len(v if pairs is None else pairs) + 1)
        if total > limit:
            return total, deepest, items
        if pairs is None:
            stack.extend((x, d + 1) for x in v)
        else:
            stack.extend((x, d + 1) for kv in pairs.items() for x in kv)
    return total, deepest, items


def conversation_size(messages, tools) -> int:
    """The size a render's budget grows with (``TemplateLimits.steps_for``): ``weight`` of
    the messages and tools (records hold no shared references), without its limits."""
    total = 0
    for group in (messages, tools):
        if type(group) is not list:
            total += weight(group)[0] if group is not None else 0
            continue
        total += ITEM_CHARS * (len(group) + 1)
        for m in group:
            if type(m) is not dict:
                total += weight(m)[0]
                continue
            total += ITEM_CHARS * (len(m) + 1)
            for k, v in m.items():  # the usual message: string keys and string values
                total += len(k) if type(k) is str else weight(k)[0]
                total += len(v) if type(v) is str else weight(v)[0]
    return total


def shallow(value) -> int:
    """What a value costs to build, not counting what its items point to: a string's
    characters, ITEM_CHARS per item of a list, tuple or dict; 0 for other values."""
    t = type(value)
    if t is str:
        return len(value)
    if t is list or t is dict or t is tuple:
        return ITEM_CHARS * len(value)
    if isinstance(value, (str, bytes)):
        return len(value)
    return ITEM_CHARS * len(value) if isinstance(value, _CONTAINERS) else 0


def text_size(value, budget: Budget) -> int:
    """An upper bound of ``len(str(value))``, weighing containers (``Budget.weigh``; a
    repr escapes a character in at most 4)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (bool, float)) or value is None:
        return 32
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    return 4 * budget.weigh(value)[0] + 2


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*\}")
_DIGITS = re.compile(r"\d+")


def format_size(fmt, args, budget: Budget) -> int:
    """An upper bound of the text ``fmt % args`` or ``fmt.format(*args)`` makes: widths
    and precisions written in its fields, widths taken from the arguments (``*``, nested
    ``{}``), and the arguments as text."""
    if not isinstance(fmt, (str, bytes)):
        return 1
    text = fmt if isinstance(fmt, str) else fmt.decode("latin-1")
    widths = 0
    for m in _PERCENT_SPEC.finditer(text):
        widths += sum(int(g) for g in m.groups() if g and g != "*")
    for m in _BRACE_SPEC.finditer(text):
        widths += sum(int(g) for g in _DIGITS.findall(m.group()))
    values = list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, tuple) else [args]
    widths += sum(v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0)
    return len(text) + widths + sum(text_size(v, budget) for v in values)


def field_size(value, spec: str, budget: Budget) -> int:
    """An upper bound of the text ``format(value, spec)`` makes, from the field's final
    spec (a width or precision taken from an argument already in it): the value as text
    (a third more for digit grouping) plus every number the spec holds."""
    numbers = sum(int(d) if len(d) <= 18 else 1 << 62 for d in _DIGITS.findall(spec))
    return text_size(value, budget) * 4 // 3 + 1 + numbers


class Budget:
    """One render's steps left, what it has built, its call depth, and its first breach
    (kept, so that no code inside the template can hide a breach by catching it)."""

    __slots__ = ("name", "limits", "steps", "left", "built", "max_built", "depth", "breach")

    def __init__(self, name: str, limits: TemplateLimits, size: int):
        self.name, self.limits = name, limits
        self.steps = self.left = limits.steps_for(size)
        self.built, self.max_built = 0, BUILT_PER_OUTPUT * limits.max_output
        self.depth = 0
        self.breach: str | None = None

    def fail(self, what: str):
        self.breach = self.breach or f"chat template {self.name} {what}"
        raise TemplateLimitError(self.breach)

    def _budget(self) -> str:
        return (f"{self.steps:,} steps (--template-max-steps {self.limits.max_steps:,} + {STEPS_PER_CHAR} per "
                f"character of this conversation)")

    def _over(self):
        self.fail(f"ran past its budget of {self._budget()}: it loops, recurses or builds text without bound; "
                  f"raise --template-max-steps only for a template you trust")

    def _too_big(self, size: int):
        self.fail(f"would build more than {self.max_built:,} characters while rendering this conversation "
                  f"({size:,} more, after {self.built:,}; the limit is {BUILT_PER_OUTPUT} x --template-max-output, "
                  f"by default {BUILT_PER_OUTPUT} x --max-record-bytes)")

    def charge(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            self._over()

    def build(self, size: int) -> None:
        """An operation built ``size`` characters (``shallow``): one step plus its share."""
        self.built += size
        if self.built > self.max_built:
            self._too_big(size)
        self.charge(1 + size // BUILD_CHARS)

    def write(self, size: int) -> None:
        self.charge(size // WRITE_CHARS)

    def afford(self, size: int) -> None:
        """Refuse, before it runs, an operation predicted to build ``size`` characters
        that the steps left cannot pay for, or that would pass what a render may build."""
        if self.built + size > self.max_built:
            self._too_big(size)
        if size // BUILD_CHARS > self.left:
            self.fail(f"would build about {size:,} characters in one step, more than the {max(0, self.left):,} steps "
                      f"left of its budget of {self._budget()} pay for at {BUILD_CHARS} characters a step; raise "
                      f"--template-max-steps only for a template you trust")

    def limit(self) -> int:
        """The most characters an operation may still build (where to stop weighing)."""
        return max(0, min(self.left * BUILD_CHARS, self.max_built - self.built))

    def weigh(self, value) -> tuple[int, int]:
        """``weight(value)`` as far as the budget allows, the walk paid for: ``(size, depth)``."""
        size, depth, items = weight(value, self.limit(), max(0, self.left) * WALK_ITEMS)
        self.charge(items // WALK_ITEMS)
        return size, depth

    def walk(self, value) -> None:
        """Pay, before it runs, for an operation that may visit every item of ``value``
        through every reference: comparing it, hashing it, searching it (two lists that
        each hold one list twice, 64 levels deep, are 2^64 items to compare). One step per
        WALK_ITEMS items and per BUILD_CHARS characters; a value the steps left cannot pay
        to walk is refused before the operation runs, and weighing it stops there."""
        if type(value) is str:
            self.charge(len(value) // BUILD_CHARS)
            return
        left = max(0, self.left)
        limit, max_items = left * BUILD_CHARS, left * WALK_ITEMS
        size, _, items = weight(value, limit, max_items)
        if size > limit or items > max_items:
            self.fail(f"would compare, hash or search more than {min(items, max_items):,} items in one step, more "
                      f"than the {left:,} steps left of its budget of {self._budget()} pay for at {WALK_ITEMS} items "
                      f"a step (a list that holds another many times is walked through every reference); raise "
                      f"--template-max-steps only for a template you trust")
        self.charge(items // WALK_ITEMS + size // BUILD_CHARS)

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(f"nests calls more than {MAX_DEPTH} deep (a macro that calls itself without end?)")

    def output(self, n: int) -> None:
        if n > self.limits.max_output:
            self.fail(f"renders more than {self.limits.max_output:,} characters for this conversation "
                      f"(--template-max-output, by default --max-record-bytes)")


# -- what single operations would build, before they run ---------------------------------
def binop_size(op: str, left, right, budget: Budget) -> int:
    """The predicted size of ``left op right`` (``+ * ** %``)."""
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                return shallow(seq) * max(n, 0)
        if isinstance(left, int) and isinstance(right, int):
            return (left.bit_length() + right.bit_length()) // 3 + 1
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            return left.bit_length() * right // 3 + 1
    elif op == "+":
        return shallow(left) + shallow(right)
    elif op == "%" and isinstance(left, (str, bytes)):
        return format_size(left, right, budget)
    return 1


def _arg(args: tuple, kwargs: dict, i: int, name: str, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _int(value, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def method_size(name: str, receiver, args: tuple, kwargs: dict, budget: Budget) -> int | None:
    """The predicted size of a call of a string, bytes or int method that can grow its
    receiver many times over in one step; None for the others."""
    if isinstance(receiver, int) and name == "to_bytes":
        return _int(_arg(args, kwargs, 0, "length", 1))
    if not isinstance(receiver, (str, bytes)):
        return None
    n = len(receiver)
    if name in ("center", "ljust", "rjust", "zfill"):
        return max(n, _int(_arg(args, kwargs, 0, "width")))
    if name == "expandtabs":
        tab = "\t" if isinstance(receiver, str) else b"\t"
        return n + receiver.count(tab) * max(0, _int(_arg(args, kwargs, 0, "tabsize", 8)))
    if name == "replace":
        return replace_size(receiver, _arg(args, kwargs, 0, "old", ""), _arg(args, kwargs, 1, "new", ""),
                            _arg(args, kwargs, 2, "count", -1))
    if name == "join":
        items = _arg(args, kwargs, 0, "iterable", ())
        if not isinstance(items, (list, tuple, str)):
            return None  # materialised first by the caller (``join_items``)
        return sum(text_size(x, budget) for x in items) + n * len(items)
    if name in ("format", "format_map"):
        return format_size(receiver, kwargs or args, budget)
    if name == "translate":
        table = _arg(args, kwargs, 0, "table")
        values = table.values() if isinstance(table, dict) else table if isinstance(table, (list, tuple)) else ()
        return n * max((shallow(v) for v in values), default=1)
    return None


def replace_size(value, old, new, count) -> int:
    if not isinstance(value, (str, bytes)) or not isinstance(old, (str, bytes)):
        return shallow(value)
    n = len(value)
    hits = n + 1 if not old else n // len(old)
    count = _int(count, -1)
    if count >= 0:
        hits = min(hits, count)
    return n + hits * shallow(new)

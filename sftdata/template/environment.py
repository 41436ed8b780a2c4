"""Render chat templates the way Hugging Face ``transformers`` renders them.

A sandboxed, immutable Jinja2 environment (templates from a model folder are untrusted
code) with ``trim_blocks`` and ``lstrip_blocks``, loop controls, and the helpers model
templates expect:

* ``tojson`` (non-ASCII kept, ``indent``/``separators``/``sort_keys`` accepted, no HTML
  escaping), ``raise_exception(msg)``, ``strftime_now(fmt)``;
* ``dict`` and ``namespace`` that cannot reach Python internals;
* ``{% generation %} ... {% endgeneration %}``: the characters a block renders are the
  trained span. The block wraps its output in two noncharacters (U+FDD0, U+FDD1) that
  ``render`` strips and turns into character spans, so the extension keeps no state and
  one compiled template can be shared by threads.

Variables: ``messages``, ``tools`` (``None`` when there are none), ``add_generation_prompt``,
the tokenizer's ``bos_token``/``eos_token``/``pad_token``/``unk_token``, plus any extra.

Every render runs under ``TemplateLimits`` (``limits``: a budget of steps that grows with
the conversation, an output cap, a call depth), counted by the environment of
``sandbox``; a breach, a recursion too deep for Python or memory running out is a
``TemplateLimitError`` naming the template.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from ..errors import TemplateError, TemplateLimitError
from .filters import limit_callables
from .limits import BUDGET_KEY, DEFAULT_LIMITS, MAX_TEMPLATE_CHARS, Budget, TemplateLimits, conversation_size
from .sandbox import limited_environment_class

GEN_OPEN, GEN_CLOSE = "\ufdd0", "\ufdd1"
#: characters sftdata uses inside renders; message text holding one is refused
RESERVED_CHARS = ("\ufdd0", "\ufdd1", "\ufdd2", "\ufdd3")
_GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")


class TemplateRaised(Exception):
    """What ``raise_exception`` raises inside a template (message = the template's own)."""


def has_generation_blocks(text: str) -> bool:
    return bool(_GENERATION_RE.search(text))


@lru_cache(maxsize=1)
def _environment():
    try:
        import jinja2
        import jinja2.ext
        import jinja2.nodes
    except ImportError:
        raise TemplateError("chat templates need the 'jinja2' library: pip install 'sftdata[hf]'") from None

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: mark what the assistant generates."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

        def _mark(self, caller):
            return GEN_OPEN + caller() + GEN_CLOSE

    class SafeNamespace(jinja2.utils.Namespace):
        """``namespace()`` whose attributes cannot start with an underscore."""

        def __init__(*args, **kwargs):  # noqa: N805 - the same signature trick as jinja's Namespace
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for key in attrs:
                SafeNamespace._check(key)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, key, value):
            SafeNamespace._check(key)
            jinja2.utils.Namespace.__setitem__(self, key, value)

        @staticmethod
        def _check(key):
            if isinstance(key, str) and key.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a template may not set the attribute {key!r} on a namespace")

    def make_dict(*args, **kwargs):
        return dict(*args, **kwargs)

    def raise_exception(message):
        raise TemplateRaised(str(message))

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = limited_environment_class()(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=make_dict,
                       namespace=SafeNamespace)
    env.fixed_types = env.fixed_types | {SafeNamespace}
    limit_callables(env)
    return env


@dataclass(frozen=True)
class Rendered:
    """A render: the text, and the ``{% generation %}`` spans as ``(start, end)`` character
    positions in it (empty when the template has no generation blocks)."""

    text: str
    generation: tuple[tuple[int, int], ...] = ()


@lru_cache(maxsize=32)
def compile_template(text: str, name: str = "template"):
    """Compile a template once (cached by its text). Raises ``TemplateError`` naming it."""
    if len(text) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"chat template {name} is {len(text):,} characters, more than the {MAX_TEMPLATE_CHARS:,} a "
                            f"chat template may be (the largest real ones are under 20,000): it is refused unread")
    env = _environment()
    import jinja2

    try:
        compiled = env.from_string(text)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template {name} does not compile: {e.message} (line {e.lineno})") from None
    except (RecursionError, MemoryError, SyntaxError):  # expressions nested thousands deep
        raise TemplateError(f"chat template {name} does not compile: it nests expressions or blocks too deeply "
                            f"for Python") from None
    # the environment's globals are set once, before any template compiles: a plain dict of them
    # (Jinja keeps a ChainMap) is copied into each render's context without a lookup per name (5 µs a render)
    compiled.globals = dict(compiled.globals)
    return compiled


def _split_generation(raw: str) -> Rendered:
    if GEN_OPEN not in raw:
        return Rendered(raw)
    parts = re.split(f"([{GEN_OPEN}{GEN_CLOSE}])", raw)
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    pos, depth, start = 0, 0, 0
    for part in parts:
        if part == GEN_OPEN:
            if depth == 0:
                start = pos
            depth += 1
        elif part == GEN_CLOSE:
            depth -= 1
            if depth == 0 and pos > start:
                spans.append((start, pos))
        else:
            out.append(part)
            pos += len(part)
    return Rendered("".join(out), tuple(spans))


def render(compiled, messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt: bool = False,
           variables: dict | None = None, name: str = "template", limits: TemplateLimits = DEFAULT_LIMITS) -> Rendered:
    """Render ``messages`` with a compiled template, under ``limits``. Any failure inside
    the template (its own ``raise_exception``, an undefined value, a sandbox violation) is
    a ``TemplateError`` whose message names the template and says what the template said;
    a limit it runs past is a ``TemplateLimitError``."""
    import jinja2

    context = dict(variables or {})
    context.update(messages=messages, tools=tools or None, add_generation_prompt=add_generation_prompt)
    budget = Budget(name, limits, conversation_size(messages, tools))
    context[BUDGET_KEY] = budget
    chunks = compiled.generate(context)
    try:
        parts, size = [], 0
        for chunk in chunks:  # the output cap is checked as the text grows, never after the fact
            size += len(chunk)
            budget.output(size)
            parts.append(chunk)
        if budget.breach is not None:  # a breach some code inside the template caught
            raise TemplateLimitError(budget.breach)
        raw = "".join(parts)
    except TemplateLimitError:
        raise
    except TemplateRaised as e:
        raise TemplateError(f"chat template {name} refused the conversation: {e}") from None
    except RecursionError:
        raise TemplateLimitError(f"chat template {name} recursed deeper than Python allows (a macro that calls "
                                 f"itself without end?)") from None
    except MemoryError:
        raise TemplateLimitError(f"chat template {name} ran out of memory rendering this conversation") from None
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template {name} failed: {type(e).__name__}: {e}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError) as e:
        raise TemplateError(f"chat template {name} failed: {type(e).__name__}: {e}") from None
    finally:
        chunks.close()
    return _split_generation(raw)

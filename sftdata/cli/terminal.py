"""Text from datasets, inputs, tokenizer files and file names, shown on a terminal with its
control characters escaped: no dataset can move the cursor, clear the screen, retitle the
window, open a link or fake a line, through rich or plain printing, to a TTY or a pipe.

    >>> one_line("ok\\rFAKE \\x1b]0;title\\x07")
    'ok\\\\rFAKE \\\\x1b]0;title\\\\x07'

* ``escape_controls(text)``: C0 controls but the newline and the tab, DEL, C1 controls and
  the bidirectional overrides (which reorder what a line seems to say) as Python-style
  escapes (``\\x1b``, ``\\r``, ``\\u202e``); for text shown on lines of its own (a decoded
  episode), where a newline stays a line break;
* ``one_line(text)``: the same, newlines and tabs too; for names, paths, messages and table
  cells;
* ``escape_rendered(console)``: a render hook on a console, so that every segment rich
  prints on it is escaped too (newlines kept): the backstop for text no drawing code
  escaped. Rich itself drops BEL, backspace, CR, VT and FF from ``Text`` (not ESC), so the
  drawing code escapes content first, and a ``\\r`` is shown rather than lost.
"""

from __future__ import annotations

import re

from rich.console import Console, RenderHook
from rich.segment import Segment

_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]


def _escape(cp: int) -> str:
    return _NAMED.get(cp) or (f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}")


_ONE_LINE = {cp: _escape(cp) for cp in _CONTROLS}
_LINES = {cp: e for cp, e in _ONE_LINE.items() if cp not in (0x09, 0x0A)}
_RENDERED = {cp: e for cp, e in _ONE_LINE.items() if cp != 0x0A}
_ANY = re.compile("[" + "".join(f"\\u{cp:04x}" for cp in _CONTROLS) + "]")


def escape_controls(text: str) -> str:
    """``text`` with its control characters escaped, newlines and tabs kept."""
    return text.translate(_LINES) if _ANY.search(text) else text


def one_line(text) -> str:
    """``str(text)`` with every control character escaped, newlines and tabs too."""
    text = str(text)
    return text.translate(_ONE_LINE) if _ANY.search(text) else text


class _Escaped:
    """A renderable drawn as rich draws it, with its text segments escaped."""

    def __init__(self, renderable):
        self.renderable = renderable

    def __rich_console__(self, console, options):
        for segment in console.render(self.renderable, options):
            if segment.control or not _ANY.search(segment.text):
                yield segment
            else:
                yield Segment(segment.text.translate(_RENDERED), segment.style, segment.control)


class _EscapeHook(RenderHook):
    def process_renderables(self, renderables):
        return [_Escaped(r) for r in renderables]


def escape_rendered(console: Console) -> Console:
    """Escape the control characters of everything ``console`` prints (newlines kept)."""
    console.push_render_hook(_EscapeHook())
    return console

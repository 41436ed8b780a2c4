"""Text with a long run of whitespace, encoded with cl100k_base's split pattern exactly as
tiktoken would, without tiktoken's regex running over the run.

tiktoken's regex engine (fancy-regex) backtracks ``\\s+(?!\\S)`` one character at a time on
a stack of a million entries: ``'x' + ' ' * 1_000_000 + 'y'`` fails ("Max stack size
exceeded for backtracking": a ``ValueError``, or a Rust panic from ``encode_ordinary``). So a
text holding such a run is cut around it, where the cut provably cannot change a token.

Why the cut is exact, for cl100k_base's pattern (``CL100K_PATTERNS``, both spellings)::

    '(?i:[sdmt]|ll|ve|re) | [^\\r\\n\\p{L}\\p{N}]?+\\p{L}++ | \\p{N}{1,3}+ | ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+
    | \\s++$ | \\s*[\\r\\n] | \\s+(?!\\S) | \\s

Take a maximal run of whitespace ``t[i:j]`` followed by a character that is not whitespace
(``j < len(t)``), ``k`` just after its last ``\\r`` or ``\\n`` (``i`` when it has none), and
``j - k >= 2``. Then:

1. ``t[k:j-1]`` is one piece of the split. Every piece holding a character before ``i`` ends at
   ``i`` or, the punctuation piece, runs on over ``\\r\\n`` only (``[\\r\\n]*+``), so the piece
   before ``k`` ends at some ``b <= k`` with ``t[b:j]`` whitespace; from ``b < k`` the first
   alternative that matches is ``\\s*[\\r\\n]``, up to the last newline: ``k``. From ``k``
   (no newline up to ``j``, two or more characters) the letter, digit and punctuation
   alternatives need a non-space within one character, ``\\s++$`` fails (``j < len(t)``),
   ``\\s*[\\r\\n]`` finds no newline, and ``\\s+(?!\\S)`` gives back one character: ``t[k:j-1]``.
2. ``encode(t[:k])`` gives the pieces of ``t`` before ``k``: the pattern looks behind
   nothing, and what the pieces before ``k`` look at beyond ``k`` reads the end of the text
   the same as whitespace that is no newline (a letter, digit or punctuation run stops at
   either; ``[\\r\\n]*+`` stops at either; the last piece ``t[b:k]``, all whitespace ending
   in a newline, is ``\\s++$`` at the end of ``t[:k]``: the same characters).
3. ``encode(t[j-1:])`` gives the pieces of ``t`` from ``j - 1``: a piece starts there, and
   the search from there reads only what follows.

BPE merges within a piece, so ``encode(t) == encode(t[:k]) + bpe(t[k:j-1]) +
encode(t[j-1:])``, the middle encoded by tiktoken's BPE alone (``encode_single_piece``); the
same holds again in ``t[j-1:]``. A run at the very end of a text is one ``\\s++$`` piece,
matched without backtracking: it needs no cut. tests/tokenize/test_space_runs.py holds the
cut to tiktoken's own ids on every shape of run short enough for tiktoken to encode.

The older spelling (Llama 3's ``tokenizer.json`` writes it) has no ``\\s++$``: the argument
above is unchanged for a run followed by text (from ``b < k`` the first whitespace
alternative, ``\\s*[\\r\\n]+``, ends at ``k``), and a run that ends the text backtracks too
(``ends``): from ``k`` no alternative but ``\\s+(?!\\S)`` matches, and it takes ``t[k:j]``
whole (nothing follows), so that piece is cut out. Qwen2's pattern (``\\p{N}`` for
``\\p{N}{1,3}``, ``QWEN2_PATTERN``) is the older spelling but for its digit alternative,
which the argument only needs to stop at whitespace. Where special tokens are recognised
(``stops``: the fast engine's), the regex runs on the text between them, so a run just
before one ends that text; none of them may hold whitespace (``cuttable``), so none is cut.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

# cl100k_base's split pattern, as tiktoken writes it now and before 0.7
CL100K_PATTERNS_NEW = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
CL100K_PATTERNS_OLD = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
CL100K_PATTERNS = frozenset((CL100K_PATTERNS_NEW, CL100K_PATTERNS_OLD))
# Qwen2, 2.5 and 3's split pattern: cl100k_base's older spelling with one digit per piece
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
#: the patterns the cut is proven for -> whether a run that ends the text is cut too (``ends``:
#: no ``\s++$`` to take it without backtracking)
CUT_PATTERNS = {CL100K_PATTERNS_NEW: False, CL100K_PATTERNS_OLD: True, QWEN2_PATTERN: True}
#: a text this long goes through tiktoken's buffer API, whose regex failure is an error, not a panic
LONG_TEXT = 1 << 16
#: a run this long is cut out (tiktoken's stack holds about a million; far fewer are cut, none change a token)
LONG_RUN = 1 << 14
# Unicode's White_Space property: what ``\s`` means to the Rust regex crate tiktoken uses (not
# Python's ``str.isspace``, which also counts \x1c-\x1f)
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


@lru_cache(maxsize=4)
def _runs(min_run: int) -> re.Pattern:
    """Whole runs of at least ``min_run`` whitespace characters (nothing before one is
    whitespace: a search never restarts inside a run)."""
    return re.compile(f"(?<![{WHITE_SPACE}])[{WHITE_SPACE}]{{{min_run},}}")


_WHITE = re.compile(f"[{WHITE_SPACE}]")


def overflowed(e: BaseException) -> bool:
    """tiktoken's regex ran out of backtracking stack (a ``ValueError`` from its buffer API,
    a Rust panic from ``encode_ordinary``)."""
    text = str(e)
    return "Max stack size exceeded" in text or "StackOverflow" in text


def cuttable(pat_str: str, specials) -> bool:
    """Whether ``encode_cutting_runs`` is proven for a split pattern and these special tokens
    (none holding whitespace)."""
    return pat_str in CUT_PATTERNS and not any(_WHITE.search(c) for c in specials)


def encode_cutting_runs(text: str, encode: Callable[[str], list[int]],
                        encode_piece: Callable[[bytes], list[int]], min_run: int = LONG_RUN, *,
                        ends: bool = False, stops=()) -> list[int]:
    """``encode(text)`` for a pattern of ``CUT_PATTERNS``, every run of ``min_run`` (at least
    2) whitespace characters or more after its last newline cut out and encoded as its one
    piece by ``encode_piece`` (module docstring): a run followed by text but for its last
    character; with ``ends`` (the pattern's ``CUT_PATTERNS`` value) a run that ends the text,
    or comes just before one of the special tokens ``stops`` that ``encode`` recognises, whole."""
    out: list[int] = []
    start = 0
    least = max(2, min_run)
    for m in _runs(least).finditer(text):
        i, j = m.span()
        k = max(text.rfind("\n", i, j), text.rfind("\r", i, j), i - 1) + 1  # after the run's last newline
        last = j == len(text) or any(text.startswith(s, j) for s in stops)
        if j - k < least or (last and not ends):  # short after its last newline: tiktoken takes it whole
            continue
        out += encode(text[start:k])
        cut = j if last else j - 1
        out += encode_piece(text[k:cut].encode("utf-8"))
        start = cut
    out += encode(text[start:])
    return out

"""The self-check run each time a byte-level BPE tokenizer is loaded on tiktoken's core:
a multilingual text set (code, CJK, emoji, digits, whitespace runs, every added token
alone and inside text) encoded by both engines, ids and character offsets compared, as
a template's rendered text (added tokens recognised) and as message text (special
tokens' strings kept as text).

    >>> evidence, mismatch = self_check(fast, library_tokenizer, ["<|eot_id|>", ...])
    >>> mismatch is None, evidence["texts"]
    (True, 293)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SELF_CHECK_TEXTS: tuple[str, ...] = (
    "Hello, world! It's a test: we'll see what they've done, I'm sure you'd agree.",
    "HELLO WORLD IT'S LOUD. Don'T WE'LL",
    "def tokenize(text: str) -> list[int]:\n    \"\"\"Docstring.\"\"\"\n    return [ord(c) for c in text]  # comment\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "ok": true, "x": null}}',
    "<html><body><p class=\"x\">text &amp; more</p></body></html>",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC;",
    "https://example.com/path?q=a+b&lang=en#frag user@example.org",
    "1234567890 3.14159 -42 1,000,000 2026-11-23 12:34:56 0x1F 1e-10 007",
    "12345678901234567890123456789012345678901234567890",
    "这是一个测试。中文文本，包括标点符号！还有数字123和英文words。",
    "日本語のテキストです。カタカナとひらがな、漢字を含みます。",
    "한국어 텍스트입니다. 안녕하세요, 세계!",
    "Привет, мир! Это проверка токенизатора.",
    "مرحبا بالعالم! هذا اختبار.",
    "नमस्ते दुनिया! यह एक परीक्षण है।",
    "Γειά σου Κόσμε! ελληνικά",
    "สวัสดีชาวโลก ภาษาไทย",
    "Café naïve résumé Zürich Ångström façade Œuvre ß",
    "emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨🎉 🏳️‍🌈",
    "math: ∑ᵢ xᵢ² ≤ ∞ → ∀ε>0 ∃δ; ½ ¾ ℕ ℝ",
    "    four spaces, then eight:        and tabs\t\t\tthen mixed \t \t end",
    "trailing spaces   \nnewlines\n\n\nand windows\r\nline\r\n\r\nends  \n  \n",
    "                                                                        ",
    "\n\n\n\n\n\n\n\n",
    " \t \n \r\n \u00a0\u2003\u3000 ideographic and no-break spaces",
    "a  b   c    d     e      f       g        h",
    "!!!??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
    "x" * 300,
    "ab" * 150 + " " + "é" * 100,
    "",
    " ",
    "a",
    "zero\u200bwidth\u200djoiner\ufeffbom",
)


def self_check_texts(added_tokens: Sequence[str]) -> list[str]:
    """The built-in texts, then each added token alone, inside text, and all in a row."""
    out = list(SELF_CHECK_TEXTS)
    for t in added_tokens:
        out.append(f"text{t} {t}\n{t}")
    if added_tokens:
        out.append("".join(added_tokens))
        out.append(" ".join(added_tokens) + " " + SELF_CHECK_TEXTS[0])
    return out


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


def self_check(fast, library, added_tokens: Sequence[str]) -> tuple[dict, str | None]:
    """Compare ``fast`` (a ``FastBPE``) with ``library`` (a ``tokenizers.Tokenizer`` with no
    post-processor) on ``self_check_texts``. Returns the evidence and the first
    difference as a sentence, or None when every id and offset agrees."""
    texts = [t for t in self_check_texts(added_tokens) if fast.handles(t)]
    rendered = library.encode_batch(texts, add_special_tokens=False)
    library.encode_special_tokens = True
    try:
        plain = library.encode_batch(texts, add_special_tokens=False)
    finally:
        library.encode_special_tokens = False
    tokens = 0
    for i, (text, want, want_plain) in enumerate(zip(texts, rendered, plain)):
        ids, ranks = fast.encode_rendered(text)
        tokens += len(want.ids)
        where = f"self-check text {i} ({text[:40]!r})"
        if ids.tolist() != want.ids:
            j = _first_difference(ids.tolist(), want.ids)
            return {}, f"{where} encodes differently at token {j}: tiktoken {ids.tolist()[j:j + 3]}, " \
                       f"tokenizers {want.ids[j:j + 3]}"
        offsets = fast.offsets(text, ranks)
        if offsets.reshape(-1, 2).tolist() != [list(o) for o in want.offsets]:
            return {}, f"{where}: the tokens' character offsets differ from the tokenizers library's"
        mine = fast.encode(text).tolist()
        if mine != want_plain.ids:
            j = _first_difference(mine, want_plain.ids)
            return {}, f"{where} encodes differently as message text at token {j}"
    return {"texts": len(texts), "characters": sum(map(len, texts)), "tokens": tokens,
            "added_tokens": len(added_tokens), "ids_and_offsets_equal": True}, None

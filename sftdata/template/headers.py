"""Where an assistant reply opens and closes, read off a template's renders of probe
conversations: its header texts and end-of-turn texts (``learn_layout``, or read off
``{% generation %}`` blocks: ``generation_layout``), the stop appended after a last reply
the template leaves unclosed, the header it writes after a user message with no generation
prompt asked for, and the ids of those headers as tokenized in context (``header_ids``,
``asked_ids``). Pure functions of rendered text and encodings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import TemplateError
from ..tokenize.hf import HFTokenizer
from .spans import SENT_CLOSE, SENT_OPEN, Layout, closed_blocks, sentinel_messages


def last_added(text: str, lo: int, hi: int, added: list[str]) -> tuple[int, str] | None:
    """The added token whose occurrence in ``text[lo:hi]`` ends last."""
    best = None
    for t in added:
        at = text.rfind(t, lo, hi)
        if at >= 0 and (best is None or at + len(t) > best[0] + len(best[1])):
            best = (at, t)
    return best


def first_added(text: str, lo: int, hi: int, added: list[str]) -> tuple[int, str] | None:
    best = None
    for t in added:
        at = text.find(t, lo, hi)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, t)
    return best


@dataclass
class Found:
    """What the probes showed so far: headers, end-of-turn texts, and whether a last reply is left unclosed."""

    headers: list[str]
    ends: list[str]
    unclosed: bool = False
    tails: list[str] = field(default_factory=list)  # what follows a last reply closed by no added token
    between: list[str] = field(default_factory=list)  # what follows an earlier one, to the next message's text


def learn_layout(render, probes, gen_prompt: str, added: list[str], name: str, found: Found) -> None:
    """Add to ``found`` what ``probes`` show (``render``: messages, tools -> text)."""
    headers, ends = found.headers, found.ends
    first = first_added(gen_prompt, 0, len(gen_prompt), added) if gen_prompt else None
    shortest = first[0] + len(first[1]) + 1 if first else len(gen_prompt)
    for messages, tools in probes:
        sent, _ = sentinel_messages(list(messages))
        s = render(sent, tools)
        for i, m in enumerate(messages):
            if m["role"] != "assistant" or m.get("tool_calls"):
                continue
            mark = f"\ufdd2c{i}\ufdd3"
            at = s.find(mark)
            if at < 0:
                continue  # a template may drop earlier replies; the per-reply path handles those
            nxt = s.find("\ufdd2", at + len(mark))  # the next message's text: a reply's end comes before it
            since = s.rfind(SENT_CLOSE, 0, at) + 1  # the previous message's text ends there
            end = _reply_end(s, since, at, at + len(mark), len(s) if nxt < 0 else nxt, gen_prompt[:shortest], added)
            after = s[at + len(mark):len(s) if nxt < 0 else nxt]
            if end is None and any(after.startswith(e) for e in ends if e not in added):
                pass  # closed by a text marker already learned
            elif end is None:
                last = i == len(messages) - 1 and not s[at + len(mark):].strip()
                (found.tails if last else found.between).append(after)
                found.unclosed = found.unclosed or last  # the last reply, closed by nothing: a stop is appended
            elif end[1] not in ends:
                ends.append(end[1])
            if gen_prompt and not s.endswith(gen_prompt, 0, at):
                # a generation prompt that supplies more than the role header (Qwen3 without
                # thinking appends an empty think block): the replies the template writes
                # itself open with the longest part of it that still names the role
                k = next((k for k in range(len(gen_prompt) - 1, shortest - 1, -1)
                          if s.endswith(gen_prompt[:k], 0, at)), None)
                if k is not None and gen_prompt[:k] not in headers:
                    headers.append(gen_prompt[:k])
            if not any(s.rfind(h, since, at) >= 0 for h in headers):
                headers.append(_own_header(s, since, at, gen_prompt, shortest, added, name))
    if found.between:
        _text_marker(found, added, name)
    if not ends and not found.unclosed:
        raise TemplateError(f"chat template {name} renders no assistant reply's text in a probe conversation; "
                            f"replies cannot be located")


def _text_marker(found: Found, added: list[str], name: str) -> None:
    """A template that closes a reply with text, no added token (RWKV World's ``\n\n``): the
    text it writes after a last reply is the end-of-turn marker, where every earlier reply
    is followed by it too; the rule then ends a reply at the marker's token ids
    (``MaskRule.end_seqs``), and a reply whose own text holds them is rejected by name."""
    marker = found.tails[0] if found.tails and len(set(found.tails)) == 1 else ""
    if not marker or first_added(marker, 0, len(marker), added) is not None or \
            not all(b.startswith(marker) for b in found.between):
        raise TemplateError(f"chat template {name} writes no special token after an assistant reply, and no text "
                            f"after every reply that could end one, so no rule can tell where a reply stops (the "
                            f"model would never learn to stop)")
    found.ends.append(marker)
    found.unclosed = False


def _reply_end(s: str, since: int, at: int, lo: int, hi: int, role: str, added: list[str]) -> tuple[int, str] | None:
    """The end-of-turn token after a reply's text (``s[lo:hi]``): the first added token there,
    unless the template also writes it between the reply's role header (``role``: the
    start of the generation prompt, after ``since``) and its text, where a rule would end the
    reply early: Kimi K3 closes the reasoning with ``<|close|>think`` and the answer with
    ``<|close|>response``, the turn with ``<|end_of_msg|>``. Then the first added token
    after the text that the reply's opening does not hold."""
    first = first_added(s, lo, hi, added)
    head = s.find(role, since, at) if role else -1
    if first is None or head < 0 or s.find(first[1], head, at) < 0:
        return first
    pos = first[0] + len(first[1])
    while (nxt := first_added(s, pos, hi, added)) is not None:
        if s.find(nxt[1], head, at) < 0:
            return nxt
        pos = nxt[0] + len(nxt[1])
    return first


def _own_header(s: str, since: int, at: int, gen_prompt: str, shortest: int, added: list[str], name: str) -> str:
    """The header of a reply the generation prompt does not open (Command R7B writes
    ``<|START_RESPONSE|>`` after the role tokens): from the longest start of the generation
    prompt before it to the reply; a reply with no header of its own (DeepSeek writes the
    reply after a tool result bare) opens after the special token before it."""
    for k in range(len(gen_prompt), max(shortest, 1) - 1, -1):
        pos = s.rfind(gen_prompt[:k], since, at)
        if pos >= 0:
            return s[pos:at]
    head = last_added(s, since, at, added)
    if head is None:
        e = TemplateError(f"chat template {name} writes no assistant header and no special token "
                          f"before a reply; a reply's start cannot be told from the token ids")
        e.reason = "reply_not_located"  # a record holding such a reply is rejected as that (Apertus after a tool result)
        raise e
    return head[1]


def generation_layout(render_full, probes, gen_prompt: str, added: list[str], name: str) -> tuple[Layout, bool]:
    headers: list[str] = []
    ends: list[str] = []
    inclusive: set[bool] = set()
    for messages, tools in probes:
        out = render_full(list(messages), tools)
        if not out.generation:
            raise TemplateError(f"chat template {name} has {{% generation %}} blocks but marks nothing in a probe "
                                f"conversation; every assistant reply would be untrained")
        for start, end in closed_blocks(out.text, out.generation, added, (gen_prompt,)):
            text = out.text
            if gen_prompt and text.endswith(gen_prompt, 0, start):
                head = gen_prompt
            else:
                found = last_added(text, 0, start, added)
                if found is None:
                    raise TemplateError(f"chat template {name}: no special token precedes a generation block")
                head = text[found[0]:start]
            closing = next((t for t in added if text.endswith(t, start, end)), None)
            if closing is None:
                found = first_added(text, end, len(text), added)
                if found is None or found[0] != end:
                    raise TemplateError(f"chat template {name}: a generation block is neither closed by nor followed "
                                        f"by a special token, so no rule can tell where a reply stops")
                closing = found[1]
            inclusive.add(text.endswith(closing, start, end))
            headers += [head] if head not in headers else []
            ends += [closing] if closing not in ends else []
    if len(inclusive) != 1:
        raise TemplateError(f"chat template {name}: some generation blocks include the end-of-turn token and some "
                            f"do not; one rule cannot re-derive both")
    return Layout(tuple(headers), tuple(ends)), inclusive.pop()


def appended_stop(tok: HFTokenizer, ends: list[str]) -> str:
    """The token appended after a last reply the template leaves unclosed: the tokenizer's
    EOS when it is one of its added tokens, else the end-of-turn token it writes elsewhere."""
    eos = tok.token_strings.get("eos_token")
    if eos is not None and eos in tok.added_tokens:
        return eos
    if ends:
        return ends[0]
    raise TemplateError("the template writes no special token after a reply, and the tokenizer names no EOS token "
                        "to append; give the tokenizer's eos_token in its tokenizer_config.json")


def written_prompt(render_full, tools, added: list[str]) -> str:
    """The assistant header of a template that writes it after the last user message
    whether a generation prompt is asked for or not (Firefunction, Command R7B): what
    follows a user message's text when it ends the conversation, less the end-of-turn
    token that closes it (the first added token); "" when nothing is left."""
    mark = "\ufdd2c0\ufdd3"
    text = render_full([{"role": "user", "content": mark}], tools).text
    at = text.find(mark)
    if at < 0:
        return ""
    tail = text[at + len(mark):]
    first = first_added(tail, 0, len(tail), added)
    if first is None:
        return ""
    rest = tail[first[0] + len(first[1]):]
    return rest if first_added(rest, 0, len(rest), added) is not None and rest.strip() else ""


def _turn_header(s: str, since: int, at: int, ends: tuple[str, ...], added: list[str], bos: str | None,
                 text_turns: bool = False) -> str | None:
    """The header the template writes before the text of the message at ``at`` (the text
    of the one before it ends at ``since``): from the first added token after the last
    end-of-turn text there (BOS skipped) to the end of its line, trailing spaces left out
    (the turn's own text may follow on it, or a system text the template joins to it); the
    end-of-turn text itself where nothing follows it (GLM's ``<|user|>`` both ends a reply
    and opens a user turn); None where the template writes no token there."""
    lo = since
    last_end = None
    for e in ends:
        pos = s.rfind(e, since, at)
        if pos >= 0 and (last_end is None or pos > last_end[0]):
            last_end = (pos, e)
    if last_end is not None:
        lo = last_end[0] + len(last_end[1])
    while (hit := first_added(s, lo, at, added)) is not None and hit[1] == bos:
        lo = hit[0] + len(hit[1])
    if hit is not None:
        eol = s.find("\n", hit[0] + len(hit[1]), at)
        return s[hit[0]:at if eol < 0 else eol].rstrip() or None
    if text_turns:  # a turn written in text only: its line's text (``User:``), none at a conversation's start
        eol = s.find("\n", lo, at)
        return (s[lo:at if eol < 0 else eol].strip() or None) if last_end is not None else None
    return last_end[1] if last_end is not None else None


def _tiled_ids(text: str, lo: int, hi: int, enc) -> tuple[int, ...] | None:
    """The ids of the tokens that tile ``text[lo:hi]`` exactly, or None."""
    idx = np.flatnonzero((enc.offsets[:, 0] >= lo) & (enc.offsets[:, 1] <= hi))
    if idx.size == 0 or enc.offsets[idx[0], 0] != lo or enc.offsets[idx[-1], 1] != hi or \
            not np.array_equal(enc.offsets[idx[1:], 0], enc.offsets[idx[:-1], 1]):
        return None
    return tuple(int(i) for i in enc.ids[idx])


def marker_ids(encoded, markers: list[str], name: str) -> list[tuple[int, ...]]:
    """The id sequences of the text end-of-turn ``markers`` as tokenized in the probe
    episodes (``encoded``: ``(text, spans, enc)``), where each closes a trained span: GPT-2's
    pattern gives ``\n\n`` alone at the end of a text but ``\n``, ``\n`` before a word, so
    one marker may have several. Raises ``TemplateError`` where a marker is not on token
    boundaries (it merges with the reply's last characters or the next turn's first)."""
    found: list[tuple[int, ...]] = []
    for text, spans, enc in encoded:
        for _, end in spans:
            marker = next((m for m in markers if text.endswith(m, 0, end)), None)
            if marker is None:
                continue
            ids = _tiled_ids(text, end - len(marker), end, enc)
            if ids is None:
                raise TemplateError(f"chat template {name}: its end-of-turn text {marker!r} (no special token) "
                                    f"is not on token boundaries with this tokenizer, so no rule over token ids can "
                                    f"find where a reply stops")
            found += [ids] if ids not in found else []
    return found


def asked_ids(render, probes, encoded, ends: tuple[str, ...], added: list[str],
              bos: str | None, text_turns: bool = False) -> tuple[tuple[int, ...], ...]:
    """``MaskRule.asked``: the id sequences of the headers of the turns a reply answers
    (user turns, tool results) in the probe conversations, as tokenized in their renders
    (``encoded``: ``(text, spans, enc)`` per probe episode). ``text_turns``: the template
    ends replies with text (a marker, no added token): a turn's header is then its line's
    text after that marker (RWKV World's ``User:``)."""
    texts: set[str] = set()
    for messages, tools in probes:
        sent, _ = sentinel_messages(list(messages))
        s = render(sent, tools)
        for i, m in enumerate(messages):
            at = s.find(f"{SENT_OPEN}c{i}{SENT_CLOSE}") if m["role"] in ("user", "tool") else -1
            if at >= 0:
                head = _turn_header(s, s.rfind(SENT_CLOSE, 0, at) + 1, at, ends, added, bos, text_turns)
                texts.update([head] if head else [])
    found: set[tuple[int, ...]] = set()
    for text, _, enc in encoded:
        for head in texts:
            pos = text.find(head)
            while pos >= 0:
                ids = _tiled_ids(text, pos, pos + len(head), enc)
                found.update([ids] if ids else [])
                pos = text.find(head, pos + 1)
    return tuple(sorted(found))


def header_ids(text: str, start: int, enc, header_texts: tuple[str, ...], name: str) -> tuple[int, ...]:
    """The ids of the header that ends at ``start``, as tokenized in context (a header encoded
    alone may split differently: GPT-2's pattern gives "\n\n" alone but "\n", "\n" before a word)."""
    head = next((h for h in header_texts if text.endswith(h, 0, start)), None)
    if head is None:
        raise TemplateError(f"chat template {name}: a reply in a probe conversation does not follow a known header")
    lo = start - len(head)
    inside = (enc.offsets[:, 0] >= lo) & (enc.offsets[:, 1] <= start)
    idx = np.flatnonzero(inside)
    tiles = idx.size > 0 and np.array_equal(enc.offsets[idx[1:], 0], enc.offsets[idx[:-1], 1])
    if not tiles:
        raise TemplateError(f"chat template {name}: no token of the assistant header {head!r} lies wholly inside "
                            f"it with this tokenizer, so no rule over token ids can find where a reply starts")
    # a header whose first characters merge with the text before it (Apriel's
    # ``\n<|begin_assistant|>\n`` after a tool result's text): its tokens wholly inside it
    # a header whose last characters merge with the reply's first ones into one token
    # (StepFun's ``<|im_start|>assistant\n<think>\n`` before a reply opening with a newline):
    # the boundary token belongs to the reply. The header is then its tokens wholly before
    # the reply, and that token, holding the reply's first characters, is trained (as
    # ``token_ranges`` maps the reply's span); where the header ends on a boundary its own
    # longer ids are the header, the longest at a place winning (``rule_spans``)
    return tuple(int(i) for i in enc.ids[idx])

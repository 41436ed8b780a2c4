"""A preference record rendered: the prompt's ids once, each completion's ids and mask,
split in token space and proven.

    >>> out = render_record(rec, tok, profile, rule, policy, where)   # PairRender, or raises RecordError
    >>> out.prompt, out.completions[0], out.masks[0]

Each side (``prompt + completion``) is parsed like a ``prepare-chat`` record and rendered
whole, tokenized once (under a model's template: exactly ``apply_chat_template``'s text of
the whole conversation). The prompt is the template's render of the prompt's messages with
the generation prompt (``add_generation_prompt=True``, tools included), tokenized alone;
with sftdata's markers, the prompt's spans and ``<|ASSISTANT|>``. Each whole render must
begin with the prompt's ids exactly; a side where it does not is refused
(``prompt_not_prefix``, naming the first differing token), never re-split. A completion is
the rest of its render; its mask is the one rule's (``chat.pair_rule``), and must equal the
mask the render itself located (``rule_mismatch``) and train at least one token
(``empty_completion``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..chat.loss_rule import LossRule
from ..chat.pair_rule import completion_masks
from ..chat.render import render as render_markers
from ..chat.template_rule import spans_mask
from ..chat.tokenizer import ChatTokenizer
from ..errors import RecordError, TemplateError, TokenizerFailure
from ..records.conversation import Conversation, parse_record
from ..records.preference import PreferenceRecord, PromptRecord
from ..records.turns import TurnPolicy
from ..template import TemplateProfile, check_texts, fit_to_template, plan_record, tool_schemas
from ..util.collector import fewer_collections

ENCODE_BATCH = 64  # the fewest texts of a chunk encoded on a second thread (fewer: not worth the hand-over)


@dataclass(frozen=True)
class PairRender:
    """``prompt`` ids; per completion (chosen, rejected; or KTO's one) its ids and mask;
    ``repairs``: what was repaired in the record (per side, joined)."""

    prompt: np.ndarray
    completions: tuple[np.ndarray, ...]
    masks: tuple[np.ndarray, ...]
    repairs: tuple[str, ...] = ()
    conversations: tuple[Conversation, ...] = ()  # each side as read (prompt + completion), for curation


def _side(obj: dict, n_completion: int, where: str, policy: TurnPolicy) -> tuple[Conversation, int]:
    """The side's conversation and how many of its turns are the prompt's."""
    conv = parse_record(obj, where, "tool", policy)
    k = len(conv.turns) - n_completion
    if k <= 0 or conv.turns[k].role != "assistant":
        raise RecordError("completion_not_assistant", f"the completion ({n_completion} message(s)) does not start "
                          f"with an assistant message once the record is read (repairs merge or drop messages: "
                          f"{', '.join(conv.repairs) or 'none'}); give completions that start with the assistant's "
                          f"reply after a prompt that ends with a user or tool message", where)
    return conv, k


def equal_arrays(a: np.ndarray, b: np.ndarray) -> bool:
    """``np.array_equal`` of two 1-d arrays, at a fraction of its cost for short ones."""
    if a is b:
        return True
    if a.shape != b.shape:
        return False
    return a.tobytes() == b.tobytes() if a.dtype == b.dtype else bool((a == b).all())


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.shape[0], b.shape[0])
    d = np.flatnonzero(a[:n] != b[:n])
    return int(d[0]) if d.size else n


def _not_prefix(tok, prompt: np.ndarray, whole: np.ndarray, side: str, where: str) -> RecordError:
    p = _first_difference(prompt, whole)
    got = repr(tok.token_text(int(whole[p]))) if p < whole.shape[0] else "the end"
    return RecordError("prompt_not_prefix", f"the {side} render does not begin with the prompt rendered alone with "
                       f"the generation prompt: token {p} is {tok.token_text(int(prompt[p]))!r} in the prompt and "
                       f"{got} in prompt + {side} (the template renders the prompt differently once a reply follows, "
                       f"or tokens merge across the boundary); the pair is not split in text, so it is left out",
                       where)


@dataclass
class _Side:
    """One side of a record, planned: its conversation, repairs and, once encoded, the
    prompt's ids, the whole render's ids and the mask of the replies the render located.
    Under a template these come from the chunk's one encoding (``prompt_at``, ``whole_at``:
    indices of the texts; ``spans``: the located replies' characters)."""

    name: str
    conv: Conversation
    repairs: tuple[str, ...]
    prompt: np.ndarray | None = None
    whole: np.ndarray | None = None
    located: np.ndarray | None = None
    prompt_at: int = -1
    whole_at: int = -1
    spans: tuple = ()


def _template_side(side: _Side, k: int, tok, profile: TemplateProfile, where: str, prompts: dict,
                   texts: list[str]) -> _Side:
    """Plan one side under a template: its whole render and its prompt's render with the
    generation prompt join ``texts`` (encoded later, with the chunk's); ``prompts``: the
    text index of each prompt rendered in the chunk so far, by its messages, tools and
    variables (the render is a function of them): chosen's and rejected's prompt, and the
    prompt of several pairs of one prompt (UltraFeedback's), are rendered and tokenized once."""
    conv = fit_to_template(side.conv, profile, where)
    plan, turns, repairs = plan_record(conv, profile, tok, where, leading_is_context=True)  # only the completion trains
    if len(turns) != len(conv.turns):
        raise RecordError("completion_not_assistant", "the template renders this side only after repairs that "
                          f"change its messages ({', '.join(repairs)}), so its prompt cannot be told", where)
    if plan.per_reply and sum(t.role == "assistant" for t in turns[k:]) > 1:
        raise RecordError("template_rewrites_history", f"chat template {profile.template.name} renders each reply "
                          f"of this completion exactly only as the last of the conversation ({plan.per_reply}); a "
                          f"completion of several replies cannot be one render", where)
    messages, tools = profile.messages(conv, turns)[:k], tool_schemas(conv)
    key = repr((messages, tools, conv.template_kwargs))
    at = prompts.get(key)
    if at is None:
        text = profile.render_fn(tools, conv.template_kwargs)(messages, add_generation_prompt=True)
        at = prompts[key] = len(texts)
        texts.append(text)
    texts.append(plan.texts[-1])  # the whole conversation (per reply: the render up to its last reply)
    side.repairs, side.prompt_at, side.whole_at, side.spans = repairs, at, len(texts) - 1, plan.spans[-1]
    return side


def _marker_side(conv: Conversation, k: int, tok: ChatTokenizer, where: str
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    r = render_markers(conv, tok)
    ids = r.ids
    before = sum(1 for t in conv.turns[:k] if t.role == "assistant")  # <|ASSISTANT|> markers in the prompt
    opens = np.flatnonzero(np.isin(ids, [m for m in (tok.ids.assistant, tok.ids.assistant_context) if m is not None]))
    if opens.shape[0] <= before:
        raise RecordError("completion_not_assistant", "the completion renders no assistant span", where)
    end = int(opens[before]) + 1
    return ids[:end], ids, r.mask, tuple(conv.repairs)


@dataclass
class _Planned:
    """A record's sides planned, in order, up to ``error``: what stopped side
    ``len(sides)`` (its parsing, rendering or, later, tokenizing); None: every side."""

    sides: list[_Side]
    error: RecordError | None = None


def _plan(rec: PreferenceRecord, tok, profile: TemplateProfile | None, policy: TurnPolicy, where: str,
          texts: list[str], prompts: dict) -> _Planned:
    """The sides of ``rec`` planned in order (with sftdata's markers: rendered and
    tokenized), up to the first that cannot be; ``prompts``: the chunk's prompt renders
    so far (``_template_side``)."""
    sides: list[_Side] = []
    names = ("chosen", "rejected") if len(rec.completions) == 2 else ("completion",)
    for name, obj, c in zip(names, rec.conversations(), rec.completions):
        try:
            conv, k = _side(obj, len(c), where, policy)
            side = _Side(name, conv, ())
            if profile is None:
                side.prompt, side.whole, side.located, side.repairs = _marker_side(conv, k, tok, where)
            else:
                _template_side(side, k, tok, profile, where, prompts, texts)
        except RecordError as e:
            return _Planned(sides, e)
        except (TemplateError, TokenizerFailure) as e:
            return _Planned(sides, RecordError(e.reason, str(e), where))
        sides.append(side)
    return _Planned(sides)


def _stop(p: _Planned, i: int, e: TokenizerFailure, where: str) -> None:
    """Side ``i`` of ``p`` failed in the tokenizers library: the record stops there."""
    p.sides[i:] = []
    p.error = RecordError(e.reason, str(e), where)


class _Encoding:
    """A chunk's texts being tokenized. With a ``pool`` (one thread), the texts the fast
    engine handles are joined here and its core encodes them on the pool's thread while
    this one goes on (the next chunk renders meanwhile: the core lets go of the
    interpreter); ``result`` then adds what only the library encodes, on this thread.
    Without one, or for a chunk under ``ENCODE_BATCH`` texts, ``result`` encodes them all.
    The ids are those of encoding each text alone either way."""

    def __init__(self, tok, texts: list[str], pool: Executor | None):
        self.batch = self.job = None
        if pool is not None and len(texts) >= ENCODE_BATCH and getattr(tok, "encodes_apart", False):
            self.batch = tok.fast_batch(texts)
            if self.batch is not None:
                self.job = pool.submit(tok.encode_fast_batch, self.batch)

    def result(self, tok, texts: list[str]) -> list | None:
        """Each text's ``Encoded``; None: the tokenizer failed on some text."""
        try:
            if self.job is None:
                return tok.encode_rendered_many(texts) if texts else []
            return tok.encode_rendered_rest(texts, tok.fast_batch_results(self.batch, self.job.result(), len(texts)))
        except TokenizerFailure:
            return None


def _encode(planned: list[_Planned], texts: list[str], tok, wheres: Sequence[str], encoded: list | None) -> None:
    """Fill each template side's ids and located mask from the encoding of every text
    (``_Encoding``'s) and one location of every side's replies. Where the tokenizers
    library failed on the chunk (``encoded`` None) or fails locating, each record's sides
    are done again one by one, and a side it fails on stops its record there
    (``tokenizer_error``), the others unaffected."""
    pending = [(i, s) for i, p in enumerate(planned) for s in p.sides if s.whole_at >= 0]
    if not pending:
        return
    if encoded is None:
        encoded = [None] * len(texts)
        for i, p in enumerate(planned):
            for j, s in enumerate(list(p.sides)):
                at = [a for a in (s.prompt_at, s.whole_at) if a >= 0 and encoded[a] is None]
                try:
                    for a, e in zip(at, tok.encode_rendered_many([texts[a] for a in at]) if len(at) > 1 else
                                    [tok.encode_rendered(texts[a]) for a in at]):
                        encoded[a] = e
                except TokenizerFailure as e:
                    _stop(p, j, e, wheres[i])
                    break
        pending = [(i, s) for i, p in enumerate(planned) for s in p.sides if s.whole_at >= 0]
    try:
        _locate(pending, encoded, texts, tok)
    except TokenizerFailure:
        for i, p in enumerate(planned):
            for j, s in enumerate(list(p.sides)):
                try:
                    _locate([(i, s)], encoded, texts, tok)
                except TokenizerFailure as e:
                    _stop(p, j, e, wheres[i])
                    break


def _locate(sides: list[tuple[int, _Side]], encoded: list, texts: list[str], tok) -> None:
    """Each side's ids, its prompt's, and the mask of the replies its render located."""
    sides = [(i, s) for i, s in sides if s.whole_at >= 0]
    if not sides:
        return
    wholes = [encoded[s.whole_at] for _, s in sides]
    lo, hi = tok.token_ranges_many([texts[s.whole_at] for _, s in sides], wholes,
                                   [[(a, b) for _, a, b in s.spans] for _, s in sides])
    n_tok = np.fromiter((e.ids.shape[0] for e in wholes), dtype=np.int64, count=len(wholes))
    n_span = np.fromiter((len(s.spans) for _, s in sides), dtype=np.int64, count=len(sides))
    tok_start = np.cumsum(n_tok) - n_tok
    owner = np.repeat(np.arange(len(sides)), n_span)
    located = spans_mask(int(n_tok.sum()), lo + tok_start[owner], np.maximum(hi, lo) + tok_start[owner])
    for (_, s), e, a, n in zip(sides, wholes, tok_start.tolist(), n_tok.tolist()):
        s.prompt, s.whole, s.located = encoded[s.prompt_at].ids, e.ids, located[a:a + n]


def _split(p: _Planned, tok, where: str) -> tuple[list, RecordError | None]:
    """The record's sides split after its one prompt, in order, up to the first that
    cannot be: ``[(prompt, completion, located mask of the completion)]`` and the error
    that stopped them (``prompt_differs``, ``prompt_not_prefix``, or the planning's)."""
    out: list = []
    for s in p.sides:
        prompt = p.sides[0].prompt
        if not equal_arrays(prompt, s.prompt):
            return out, RecordError("prompt_differs", f"the prompt renders differently beside chosen and {s.name} "
                                    f"(token {_first_difference(prompt, s.prompt)}); give both completions one prompt",
                                    where)
        n = prompt.shape[0]
        if s.whole.shape[0] <= n or not equal_arrays(s.whole[:n], prompt):
            return out, _not_prefix(tok, prompt, s.whole, s.name, where)
        out.append((prompt, np.ascontiguousarray(s.whole[n:]), s.located[n:]))
    return out, p.error


def _finish(sides: list[_Side], split: list, masks: list[np.ndarray], error: RecordError | None, tok,
            where: str) -> PairRender:
    """The record's ``PairRender`` once each split side's rule mask is known; raises the
    first side's error in order: a split side's ``rule_mismatch`` or ``empty_completion``,
    else ``error`` (what stopped the sides after them), else ``identical_completions``."""
    for s, (_, comp, located), mask in zip(sides, split, masks):
        if not equal_arrays(mask, located):
            p_ = int(np.flatnonzero(mask != located)[0])
            raise RecordError("rule_mismatch", f"{s.name}: token {p_} of the completion "
                              f"({tok.token_text(int(comp[p_]))!r}) is {'trained' if located[p_] else 'not'} "
                              f"in the render but {'trained' if mask[p_] else 'not'} by the mask rule; verify "
                              f"could not prove it, so the pair is left out", where)
        if not mask.any():
            raise RecordError("empty_completion", f"the {s.name} completion trains no token", where)
    if error is not None:
        raise error
    completions = tuple(c for _, c, _ in split)
    if len(completions) == 2 and equal_arrays(completions[0], completions[1]):
        raise RecordError("identical_completions", "chosen and rejected render to the same tokens", where)
    repairs = tuple(sorted({r for s in sides for r in s.repairs}))
    return PairRender(split[0][0], completions, tuple(masks), repairs, tuple(s.conv for s in sides))


@contextmanager
def one_process_run() -> Iterator[Executor]:
    """What a one-process run of chunks holds while it renders (prepare-pref's loop, pairs
    verify's re-render): the thread each chunk's texts are tokenized on (``start_records``'s
    ``pool``), and the collector held back (``util.collector``; no process pool beside it)."""
    with ThreadPoolExecutor(1, thread_name_prefix="sftdata-encode") as pool, fewer_collections():
        yield pool


@dataclass
class RenderingChunk:
    """A chunk rendered, its texts being tokenized (``start_records``)."""

    planned: list[_Planned]
    wheres: list[str]
    texts: list[str]
    encoding: _Encoding


def start_records(items: Sequence[tuple[PreferenceRecord, str]], tok, profile: TemplateProfile | None,
                  policy: TurnPolicy, pool: Executor | None = None) -> RenderingChunk:
    """The first half of ``render_records``: every record of the chunk parsed and
    rendered, and its texts' tokenizing started (on ``pool``'s thread when given:
    ``_Encoding``)."""
    texts: list[str] = []
    prompts: dict = {}
    planned = [_plan(rec, tok, profile, policy, where, texts, prompts) for rec, where in items]
    return RenderingChunk(planned, [w for _, w in items], texts, _Encoding(tok, texts, pool))


def finish_records(chunk: RenderingChunk, tok, rule: LossRule) -> list[PairRender | RecordError]:
    """The second half of ``render_records``: the chunk's ids, split and proven."""
    planned, wheres = chunk.planned, chunk.wheres
    _encode(planned, chunk.texts, tok, wheres, chunk.encoding.result(tok, chunk.texts))
    splits = [_split(p, tok, where) for p, where in zip(planned, wheres)]
    masks = iter(completion_masks(rule, [(prompt, comp) for done, _ in splits for prompt, comp, _ in done]))
    out: list[PairRender | RecordError] = []
    for p, (done, error), where in zip(planned, splits, wheres):
        got = [next(masks) for _ in done]
        try:
            out.append(_finish(p.sides[:len(done)], done, got, error, tok, where))
        except RecordError as e:
            out.append(e)
    return out


def render_records(items: Sequence[tuple[PreferenceRecord, str]], tok, profile: TemplateProfile | None,
                   rule: LossRule, policy: TurnPolicy) -> list[PairRender | RecordError]:
    """``render_record`` of each ``(record, where)``: its ``PairRender`` or the
    ``RecordError`` it raises. The chunk is rendered first, then every text is tokenized
    in one call, then the located masks and every completion's rule mask are made for the
    chunk at once (``completion_masks``): the same proof, record by record, at a fraction
    of the per-record cost. A record's refusal is its first side's first failing step, the
    sides in order (chosen, then rejected), as when the record is rendered alone. A run
    renders the next chunk while this one's texts are tokenized (``start_records``,
    ``finish_records``)."""
    return finish_records(start_records(items, tok, profile, policy), tok, rule)


def render_record(rec: PreferenceRecord, tok, profile: TemplateProfile | None, rule: LossRule,
                  policy: TurnPolicy, where: str) -> PairRender:
    """The record's prompt once and each completion, split in token space (module
    docstring). Raises ``RecordError``."""
    (out,) = render_records([(rec, where)], tok, profile, rule, policy)
    if isinstance(out, RecordError):
        raise out
    return out


def render_prompt(rec: PromptRecord, tok, profile: TemplateProfile | None, policy: TurnPolicy,
                  where: str) -> np.ndarray:
    """An RL prompt's ids: ``apply_chat_template(prompt, tools=..., add_generation_prompt=True)``
    under a template; with sftdata's markers, its spans and ``<|ASSISTANT|>``. Raises ``RecordError``."""
    obj = rec.conversation()
    msgs = obj[rec.key]
    reply = {"from": "gpt", "value": "x"} if rec.key == "conversations" else {"role": "assistant", "content": "x"}
    obj = {**obj, rec.key: [*msgs, reply]}  # a placeholder reply: a record parses with one, and is cut before it
    conv, k = _side(obj, 1, where, policy)
    try:
        if profile is None:
            return _marker_side(conv, k, tok, where)[0]
        conv = fit_to_template(conv, profile, where)
        messages, tools = profile.messages(conv, conv.turns), tool_schemas(conv)
        check_texts(messages[:k], tools, tok, where)
        text = profile.render_fn(tools, conv.template_kwargs)(messages[:k], add_generation_prompt=True)
        return tok.encode_rendered(text).ids
    except TemplateError as e:
        raise RecordError(e.reason, str(e), where) from None
    except TokenizerFailure as e:
        raise RecordError(e.reason, str(e), where) from None

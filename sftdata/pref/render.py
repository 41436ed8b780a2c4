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

from dataclasses import dataclass

import numpy as np

from ..chat.loss_rule import LossRule
from ..chat.pair_rule import completion_mask
from ..chat.render import render as render_markers
from ..chat.tokenizer import ChatTokenizer
from ..errors import RecordError, TemplateError, TokenizerFailure
from ..records.conversation import Conversation, parse_record
from ..records.preference import PreferenceRecord, PromptRecord
from ..records.turns import TurnPolicy
from ..template import TemplateProfile, check_texts, fit_to_template, plan_record, tool_schemas


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


def _located(enc, spans) -> np.ndarray:
    """The mask of the replies the render located (``spans``: (message, start, end) characters)."""
    lo, hi = enc.token_ranges([(a, b) for _, a, b in spans])
    mask = np.zeros(enc.ids.shape[0], dtype=np.uint8)
    for a, b in zip(lo.tolist(), hi.tolist()):
        mask[a:b] = 1
    return mask


def _template_side(conv: Conversation, k: int, tok, profile: TemplateProfile, where: str, prompts: dict
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """(prompt ids, whole ids, whole located mask, repairs) of one side under a template;
    ``prompts``: the prompt renders of the pair's sides so far (chosen's prompt, when the
    same messages, tools and variables, is rendered and tokenized once)."""
    conv = fit_to_template(conv, profile, where)
    plan, turns, repairs = plan_record(conv, profile, tok, where)
    if len(turns) != len(conv.turns):
        raise RecordError("completion_not_assistant", "the template renders this side only after repairs that "
                          f"change its messages ({', '.join(repairs)}), so its prompt cannot be told", where)
    if plan.per_reply and sum(t.role == "assistant" for t in turns[k:]) > 1:
        raise RecordError("template_rewrites_history", f"chat template {profile.template.name} renders each reply "
                          f"of this completion exactly only as the last of the conversation ({plan.per_reply}); a "
                          f"completion of several replies cannot be one render", where)
    enc = tok.encode_rendered(plan.texts[-1])  # the whole conversation (per reply: the render up to its last reply)
    messages, tools = profile.messages(conv, turns)[:k], tool_schemas(conv)
    key = repr((messages, tools, conv.template_kwargs))
    prompt = prompts.get(key)
    if prompt is None:
        text = profile.render_fn(tools, conv.template_kwargs)(messages, add_generation_prompt=True)
        prompt = prompts[key] = tok.encode_rendered(text).ids
    return prompt, enc.ids, _located(enc, plan.spans[-1]), repairs


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


def render_record(rec: PreferenceRecord, tok, profile: TemplateProfile | None, rule: LossRule,
                  policy: TurnPolicy, where: str) -> PairRender:
    """The record's prompt once and each completion, split in token space (module
    docstring). Raises ``RecordError``."""
    prompt = None
    prompts: dict = {}
    completions, masks, repairs, convs = [], [], [], []
    sides = ("chosen", "rejected") if len(rec.completions) == 2 else ("completion",)
    try:
        for side, obj, c in zip(sides, rec.conversations(), rec.completions):
            conv, k = _side(obj, len(c), where, policy)
            convs.append(conv)
            if profile is None:
                p, whole, located, rep = _marker_side(conv, k, tok, where)
            else:
                p, whole, located, rep = _template_side(conv, k, tok, profile, where, prompts)
            if prompt is None:
                prompt = p
            elif not np.array_equal(prompt, p):
                raise RecordError("prompt_differs", f"the prompt renders differently beside chosen and {side} (token "
                                  f"{_first_difference(prompt, p)}); give both completions one prompt", where)
            n = prompt.shape[0]
            if whole.shape[0] <= n or not np.array_equal(whole[:n], prompt):
                raise _not_prefix(tok, prompt, whole, side, where)
            comp = np.ascontiguousarray(whole[n:])
            mask = completion_mask(rule, prompt, comp)
            if not np.array_equal(mask, located[n:]):
                p_ = int(np.flatnonzero(mask != located[n:])[0])
                raise RecordError("rule_mismatch", f"{side}: token {p_} of the completion "
                                  f"({tok.token_text(int(comp[p_]))!r}) is {'trained' if located[n + p_] else 'not'} "
                                  f"in the render but {'trained' if mask[p_] else 'not'} by the mask rule; verify "
                                  f"could not prove it, so the pair is left out", where)
            if not mask.any():
                raise RecordError("empty_completion", f"the {side} completion trains no token", where)
            completions.append(comp)
            masks.append(mask)
            repairs += rep
    except TemplateError as e:
        raise RecordError(e.reason, str(e), where) from None
    except TokenizerFailure as e:
        raise RecordError(e.reason, str(e), where) from None
    if len(completions) == 2 and np.array_equal(completions[0], completions[1]):
        raise RecordError("identical_completions", "chosen and rejected render to the same tokens", where)
    return PairRender(prompt, tuple(completions), tuple(masks), tuple(sorted(set(repairs))), tuple(convs))


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

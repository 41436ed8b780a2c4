"""What prepare asks of a chat template: the profile chosen by ``--chat-template``, and each
record's episodes under the length filter, refused when the stored rule cannot prove them.

    >>> profile = model_profile(tok, "llama3")                       # once, in the driver
    >>> eps = record_episodes(conv, profile, tok, max_tokens, where)  # per record, in a worker
    >>> eps.episodes, eps.per_reply, eps.pairs_dropped
    >>> records_episodes([(conv, where), ...], profile, tok, max_tokens)  # a chunk: one list

"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..chat.serving import check_state_stops
from ..chat.tokenizer import ChatTokenizer, open_tokenizer
from ..errors import RecordError, TemplateError, TemplateLimitError, TokenizerFailure
from ..records.conversation import Conversation
from ..records.turns import STRUCTURAL_REPAIRS, Turn
from ..tokenize.hf import HFTokenizer
from .chat_template import load_chat_template
from .chunk import chunk_episodes
from .episodes import Episode, Planned, TemplateRender, plan_conversation, tokenizer_state, trained_replies
from .fit import render_within
from .learn import learn_profile
from .limits import DEFAULT_LIMITS, TemplateLimits
from .profile import TemplateProfile
from .vision import folder_processor, with_processor


@dataclass(frozen=True)
class RecordEpisodes:
    """A record's episodes; ``per_reply``: served one episode per assistant reply (why;
    ``automatic``: because its whole render is not exact, under a rule that trains every reply),
    ``pairs_dropped``: trailing pairs the length filter dropped; ``repairs`` and ``counts``:
    what was repaired in the record (per record) and counted per assistant turn, under
    this template (the record's own, less what the template did not need)."""

    episodes: tuple[Episode, ...]
    per_reply: str | None
    pairs_dropped: int
    repairs: tuple[str, ...] = ()
    counts: tuple[str, ...] = ()
    automatic: bool = False  # served per reply without --per-reply, each episode flagged last_only


def model_profile(tok: HFTokenizer, spec: str | None, variables: dict | None = None,
                  last_reply_only: bool = False, per_reply: bool = False,
                  limits: TemplateLimits = DEFAULT_LIMITS) -> TemplateProfile:
    """The profile of the template ``spec`` names (``model``, ``model:NAME``, a preset, a
    ``.jinja`` file; None: the tokenizer folder's own), learned with ``tok``. Raises
    ``TemplateError`` (a folder without a template names the presets).

    ``variables``: ``--template-var``. ``last_reply_only`` (``--train-on last``): each
    episode trains its last reply only, and its rule says so (each record is one episode:
    the conversation up to the reply it trains). ``per_reply`` (``--per-reply``): every
    record is served one episode per assistant reply, each training that reply.
    ``limits``: what every render of the template runs under; a probe that runs past them
    refuses the run here (``TemplateLimitError``)."""
    try:
        profile = learn_profile(replace(load_chat_template(spec, tok), limits=limits), tok, variables, per_reply)
    except TemplateLimitError as e:
        raise TemplateLimitError(f"{e}. It did so on a probe conversation sftdata renders before any record, so "
                                 f"the run is refused") from None
    if last_reply_only and not profile.rule.last_reply_only:
        profile = replace(profile, rule=replace(profile.rule, last_reply_only=True))
    return profile


def require_tool_calls(profile: TemplateProfile) -> None:
    """``prepare-tool``'s check, once before any record: a template that renders no tool
    call at all would lose every call, so it is refused by name (``TemplateError``)."""
    if not profile.renders_tool_calls:
        raise TemplateError(f"chat template {profile.template.name} renders no tool call (a call's name does not "
                            f"appear in its render), so every tool call of the records would be lost; prepare-tool "
                            f"refuses it. Use the model's own template for tool use (--chat-template model:NAME for "
                            f"a named one such as tool_use, or its official template as a .jinja file), or "
                            f"prepare-chat for records without tools")


def _cannot(profile: TemplateProfile, capability: str, what: str, fix: str, where: str) -> RecordError:
    if capability in profile.unlocated:  # it renders them, but a reply's start is in no token
        return RecordError("reply_not_located", f"the record holds {what}; chat template {profile.template.name} "
                           f"renders them, but {profile.unsupported[capability]}, so the record is left out; "
                           f"{fix}", where)
    return RecordError(f"template_cannot_render_{capability}", f"the record holds {what}, which chat template "
                       f"{profile.template.name} cannot render ({profile.unsupported[capability]}); {fix}", where)


def fit_to_template(conv: Conversation, profile: TemplateProfile, where: str) -> Conversation:
    """``conv`` as far as the template can carry it: a record holding a system message or
    tools the template cannot render is refused by name; reasoning a template renders for
    no reply (``TemplateProfile.reasoning`` "none") is dropped and counted per turn
    (``reasoning_ignored_by_template``; ``--reasoning inline`` writes it into the reply
    instead, before this), refused where a reply holds nothing else
    (``template_drops_reasoning``). Reasoning a template renders for some reply is kept:
    what a render drops is refused by name (``parts``), or served one reply at a time.
    Tool schemas a template never renders (it renders the same text without them: DeepSeek
    V3.1) are left out and counted per record (``tool_schemas_ignored_by_template``): the
    model never sees them at inference either."""
    turns = conv.turns
    if not profile.supports("system") and turns and turns[0].role == "system":
        raise _cannot(profile, "system", "a system message", "drop the system message from the record, or use a "
                      "template with a system role (--chat-template)", where)
    if not profile.supports("tools") and (conv.tools or any(t.tool_calls or t.role == "tool" for t in turns)):
        raise _cannot(profile, "tools", "tool schemas, calls or results", "use a template that renders tool "
                      "calls (--chat-template model:NAME or FILE.jinja), or drop the tool records", where)
    if profile.ignores_tool_schemas and (conv.tools or conv.tool_specs):
        conv = replace(conv, tools=(), tool_specs=(), repairs=conv.repairs + (SCHEMAS_IGNORED,))
        turns = conv.turns
    if profile.supports("reasoning") or profile.reasoning != "none" or not any(t.reasoning for t in turns):
        return conv  # rendered somewhere: what a render drops is refused by name (parts), never stripped
    for i, t in enumerate(turns):
        if t.reasoning and not t.text.strip() and not t.tool_calls:
            raise RecordError("template_drops_reasoning", f"assistant message {i} holds only reasoning, which chat "
                              f"template {profile.template.name} does not render "
                              f"({profile.unsupported['reasoning']}), so nothing of it would be trained; prepare with "
                              f"--reasoning inline (the reasoning written into the reply as text) or --reasoning "
                              f"drop", where)

    def strip(ts: tuple[Turn, ...]) -> tuple[Turn, ...]:
        return tuple(replace(t, reasoning="") if t.reasoning else t for t in ts)

    ignored = sum(1 for t in turns if t.reasoning)
    counts = list(conv.turn_counts)
    for _ in range(ignored):
        counts.remove("reasoning_kept")
    return replace(conv, turns=strip(turns), given=strip(conv.given),
                   turn_counts=tuple(counts) + ("reasoning_ignored_by_template",) * ignored)


#: counted per record whose tool schemas the template never renders (``fit_to_template``)
SCHEMAS_IGNORED = "tool_schemas_ignored_by_template"
#: what a template's render of a record as given may fail with, so that a repaired record is tried
UNRENDERED = ("template_error", "template_rewrites_history", "reply_not_located")


LEADING = "leading_assistant_untrained"  # counted for every record that opens with a reply, as with the markers


def _leading(turns: tuple[Turn, ...]) -> range:
    """The indices of the assistant turns before the first user turn or tool result: replies
    that answer no one (empty when the conversation opens otherwise)."""
    first = next((i for i, t in enumerate(turns) if t.role != "system"), len(turns))
    if first == len(turns) or turns[first].role != "assistant":
        return range(0)
    asked = next((i for i, t in enumerate(turns) if t.role in ("user", "tool")), len(turns))
    return range(first, asked)


def _stages(conv: Conversation, profile: TemplateProfile | None) -> list[tuple[tuple[Turn, ...], tuple[str, ...]]]:
    """What a template is given, in order, with the repairs each counts: the record as
    given; with the structural repairs (same-role turns merged, tool results in call
    order, a JSON list of results split); and then without a leading assistant turn.

    A reply that opens the conversation answers no one: it is left untrained
    (``leading_assistant_untrained``, the same count as with sftdata's markers) where the
    rule can leave it so (``MaskRule.asked``, or one episode per reply); else it is
    dropped (``dropped_leading_assistant`` as well), as where the template refuses it.
    ``profile`` None: a leading reply is context that no rule trains anyway (a preference
    pair trains its completion only), rendered as given and dropped only where refused."""
    base = tuple(r for r in conv.repairs if r not in STRUCTURAL_REPAIRS)
    out = [(conv.given_turns, base)]
    if conv.given:
        out.append((conv.turns, base + tuple(r for r in conv.repairs if r in STRUCTURAL_REPAIRS[:3])))
    turns, repairs = out[-1]
    lead = _leading(turns)
    if lead and profile is None:
        if lead.stop < len(turns) and turns[lead.stop].role == "user":
            out.append((turns[:lead.start] + turns[lead.stop:], repairs + ("dropped_leading_assistant",)))
    elif lead:
        kept = profile.rule.asked or profile.rule.last_reply_only
        out = [(tuple(replace(t, untrained="leading") if i in _leading(ts) else t for i, t in enumerate(ts)),
                rs + (LEADING,)) for ts, rs in out] if kept else []
        if lead.stop < len(turns) and turns[lead.stop].role == "user":
            out.append((turns[:lead.start] + turns[lead.stop:], repairs + (LEADING, "dropped_leading_assistant")))
    return out


def plan_record(conv: Conversation, profile: TemplateProfile, tok: HFTokenizer,
                where: str, leading_is_context: bool = False,
                media: dict | None = None) -> tuple[Planned, tuple[Turn, ...], tuple[str, ...]]:
    """The plan of the first of ``_stages`` the template renders (``UNRENDERED``), its turns
    and repairs. Raises ``RecordError``: the first stage's, saying what else was tried.
    ``leading_is_context``: a leading assistant reply is context no rule trains (a
    preference prompt's), so it is given as it is; ``media``: the record's references
    read and counted (``episodes.turn_media``)."""
    stages = _stages(conv, None if leading_is_context else profile)
    if not stages:
        raise RecordError("untrained_turn", f"the conversation opens with an assistant reply, which answers no one "
                          f"and is not trained, but chat template {profile.template.name}'s mask rule cannot leave it "
                          f"untrained and no user turn follows it to start from instead; drop it from the record",
                          where)
    first: RecordError | None = None
    for turns, repairs in stages:
        try:
            return plan_conversation(conv, profile, tok, where, turns, media), turns, repairs
        except RecordError as e:
            if e.reason not in UNRENDERED:
                raise
            first = first or e
    tried = list(dict.fromkeys(r.replace("_", " ") for r in stages[-1][1] if r not in stages[0][1]))  # each once
    also = f" (sftdata tried it also with these repairs: {', '.join(tried)})" if tried else ""
    fix = ". Fix the record so that the template accepts it, or use a template that does (--chat-template)" \
        if first.reason == "template_error" else ""
    raise RecordError(first.reason, f"{first.detail}{also}{fix}", where)


def _check_trained(conv: Conversation, profile: TemplateProfile, where: str) -> None:
    """A context assistant turn (weight 0) can be left untrained only by a last-reply rule."""
    replies = [i for i, t in enumerate(conv.turns) if t.role == "assistant"]
    trained = trained_replies(conv)
    if trained != replies and not profile.rule.last_reply_only:
        k = next(i for i in replies if i not in trained)
        raise RecordError("untrained_turn", f"assistant message {k} is context (weight 0 or train false), but a chat "
                          f"template's mask rule finds every reply by its header and would train it, so verify could "
                          f"not prove the mask; drop the turn or move it into the user's text, or prepare with "
                          f"--train-on last (each episode then trains only its last reply)", where)


def _proven(out: TemplateRender, dropped: int, profile: TemplateProfile, tok: HFTokenizer,
            where: str) -> RecordEpisodes:
    """``out`` when its stored rule re-derives every episode's mask, else ``rule_mismatch``."""
    for i, ep in enumerate(out.episodes):
        if ep.rule_mismatch is not None:
            p = ep.rule_mismatch
            which = f"episode {i + 1} of {len(out.episodes)} (one per reply: {out.per_reply}), " if out.per_reply else ""
            trained = "trains" if ep.mask[p] else "leaves untrained"
            text = tok.token_text(int(ep.ids[p]))
            if ep.mask[p] and not text.strip():
                fix = ("; the reply opens with whitespace that the tokenizer joins with the end of the assistant "
                       "header into one token, so the header is not in the token ids: remove the reply's leading "
                       "whitespace in the record")
            else:
                fix = "; --per-reply (each reply the last of its own episode) or --train-on last may prove it"
            raise RecordError("rule_mismatch", f"{which}token {p} ({text!r}): the template's "
                              f"render {trained} it, the mask rule learned from chat template {profile.template.name} "
                              f"does not; verify and pack re-derive masks with that rule, so this record cannot be "
                              f"proven and is not written{fix}", where)
    return RecordEpisodes(out.episodes, out.per_reply, dropped, automatic=out.automatic)


def records_episodes(items: Sequence[tuple[Conversation, str]], profile: TemplateProfile, tok: HFTokenizer,
                     max_tokens: int | None, media: Sequence[dict | None] | None = None
                     ) -> list[RecordEpisodes | RecordError]:
    """``record_episodes`` of many ``(conversation, where)``: a ``RecordEpisodes`` or the
    ``RecordError`` per record (``media``: per record, its references read and counted, a
    ``{MediaRef: MediaItem}``; None where it has none). Every record is rendered first, then every text is
    tokenized in one call (the tokenizer's tables stay in the CPU's caches: about 1.5x
    faster than tokenizing between renders; the fast engine's per-call cost paid once), then the masks are made and proven for
    the whole chunk at once (``chunk_episodes``)."""
    plans: list[Planned | RecordError] = []
    chosen: list[tuple[Conversation, tuple[Turn, ...], tuple[str, ...]] | None] = []
    media = [None] * len(items) if media is None else media
    for (conv, where), held in zip(items, media):
        try:
            conv = fit_to_template(conv, profile, where)
            _check_trained(conv, profile, where)
            plan, turns, repairs = plan_record(conv, profile, tok, where, media=held)
            plans.append(plan)
            chosen.append((conv, turns, repairs))
        except RecordError as e:
            plans.append(e)
            chosen.append(None)
    encoded = _encoded(plans, items, tok)
    planned = [(p, where) for p, (_, where) in zip(plans, items) if isinstance(p, Planned)]
    renders = iter(chunk_episodes([p for p, _ in planned], encoded, profile, tok, [w for _, w in planned]))
    del encoded
    out: list[RecordEpisodes | RecordError] = []
    for (_, where), p, c, held in zip(items, plans, chosen, media):
        if isinstance(p, RecordError):
            out.append(p)
            continue
        render = next(renders)
        if isinstance(render, RecordError):
            out.append(render)
            continue
        conv, turns, repairs = c
        try:
            dropped = 0
            if max_tokens is not None and max(len(e.ids) for e in render.episodes) > max_tokens:
                render, dropped = render_within(conv, profile, tok, max_tokens, where, turns, held)
            out.append(replace(_proven(render, dropped, profile, tok, where), repairs=repairs,
                               counts=conv.turn_counts))
        except RecordError as e:
            out.append(e)
        except TokenizerFailure as e:  # while measuring pairs for --max-tokens
            out.append(RecordError(e.reason, str(e), where))
    return out


def _encoded(plans: list, items: Sequence[tuple[Conversation, str]], tok: HFTokenizer) -> list:
    """The texts of every ``Planned`` in ``plans`` encoded in one call; when the tokenizers
    library fails on them (its error or a panic), record by record, and a record it fails
    on becomes its ``RecordError`` (``tokenizer_error``) in ``plans``."""
    planned = [(i, p) for i, p in enumerate(plans) if isinstance(p, Planned)]
    try:
        return tok.encode_rendered_many([t for _, p in planned for t in p.texts])
    except TokenizerFailure:
        pass
    encoded: list = []
    for i, p in planned:
        try:
            encoded.extend(tok.encode_rendered_many(list(p.texts)))
        except TokenizerFailure as e:
            plans[i] = RecordError(e.reason, str(e), items[i][1])
    return encoded


def record_episodes(conv: Conversation, profile: TemplateProfile, tok: HFTokenizer, max_tokens: int | None,
                    where: str = "") -> RecordEpisodes:
    """Render one record with the template under the length filter. Raises ``RecordError``:
    what the render raises, ``untrained_turn``, ``too_long``, and ``rule_mismatch`` when
    the mask the template renders is not the one its stored rule re-derives from the ids
    (verify and pack could not prove it, so it is not written)."""
    (res,) = records_episodes([(conv, where)], profile, tok, max_tokens)
    if isinstance(res, RecordError):
        raise res
    return res


def template_summary(tok: HFTokenizer, profile: TemplateProfile) -> dict:
    """The tokenizer and template summary ``dataset_metadata.json`` records (``mask_rule``
    as ``tokenizer_state.json`` records it, so that verify compares the two; where the
    template renders reasoning: ``reasoning_position``)."""
    t = profile.template
    return {**tok.summary(), "template": {"name": t.name, "source": t.source, "sha256": t.sha256,
                                          "reasoning_position": profile.reasoning},
            "mask_rule": profile.rule.state()}


def choose_tokenizer(spec: str | None, chat_template: str | None, train_on: str = "all", engine: str = "auto",
                     variables: dict | None = None, per_reply: bool = False, mode: str = "chat",
                     limits: TemplateLimits | None = None) -> tuple[ChatTokenizer | HFTokenizer, TemplateProfile | None]:
    """The tokenizer ``--tokenizer`` names and, for a model's own tokenizer, the profile of
    the template ``--chat-template`` names (default: the folder's own), learned once here
    and sent to the workers, with ``--template-var`` ``variables``. ``--train-on last``
    makes its rule train each episode's last reply only, ``--per-reply`` serves each reply
    as an episode. ``engine``: ``--tokenizer-engine``; ``limits``: what each render of the
    template runs under. In ``tool`` mode a template that renders no tool call is refused
    here (``require_tool_calls``). A folder with an image processor (``preprocessor_config.json``)
    has its settings read once here and the profile renders for them (``vision.with_processor``;
    a family sftdata cannot count refuses the run)."""
    tok = open_tokenizer(spec, engine)
    if isinstance(tok, ChatTokenizer):
        return tok, None
    profile = model_profile(tok, chat_template, variables, last_reply_only=train_on == "last", per_reply=per_reply,
                            limits=limits or TemplateLimits())
    settings = folder_processor(tok)
    if settings is not None:
        profile = with_processor(profile, settings, tok)
    if mode == "tool":
        require_tool_calls(profile)
    return tok, profile


def open_for_build(opts, per_reply: bool = False, mode: str = "chat") -> tuple:
    """A build command's tokenizer and template profile (``choose_tokenizer`` with ``opts``'
    --tokenizer, --chat-template, --train-on, --tokenizer-engine, --template-var and
    template limits) and the tokenizer state its dataset records; a model that could not
    learn to stop is refused now (``check_state_stops``, --allow-pad-as-stop)."""
    tok, profile = choose_tokenizer(opts.tokenizer, opts.chat_template, opts.train_on, opts.tokenizer_engine,
                                    opts.template_vars, per_reply, mode, opts.template_limits())
    state = tok.state() if profile is None else tokenizer_state(tok, profile)
    check_state_stops(state, opts.allow_pad_as_stop)
    return tok, profile, state

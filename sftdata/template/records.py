"""What prepare asks of a chat template: the profile chosen by ``--chat-template``, and each
record's episodes under the length filter, refused when the stored rule cannot prove them.

    >>> profile = model_profile(tok, "llama3")                       # once, in the driver
    >>> eps = record_episodes(conv, profile, tok, max_tokens, where)  # per record, in a worker
    >>> eps.episodes, eps.per_reply, eps.pairs_dropped
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..conversation import Conversation
from ..errors import RecordError
from ..hf_tokenizer import HFTokenizer
from .chat_template import load_chat_template
from .episodes import Episode, trained_replies
from .fit import render_within
from .profile import TemplateProfile, learn_profile


@dataclass(frozen=True)
class RecordEpisodes:
    """A record's episodes; ``per_reply``: served one episode per assistant reply (why),
    ``pairs_dropped``: trailing pairs the length filter dropped."""

    episodes: tuple[Episode, ...]
    per_reply: str | None
    pairs_dropped: int


def model_profile(tok: HFTokenizer, spec: str | None, variables: dict | None = None,
                  last_reply_only: bool = False) -> TemplateProfile:
    """The profile of the template ``spec`` names (``model``, ``model:NAME``, a preset, a
    ``.jinja`` file; None: the tokenizer folder's own), learned with ``tok``. Raises
    ``TemplateError`` (a folder without a template names the presets).

    ``last_reply_only`` (``--train-on last``): each episode trains its last reply only,
    and its rule says so (each record is one episode: the conversation up to the reply it
    trains)."""
    profile = learn_profile(load_chat_template(spec, tok), tok, variables)
    if last_reply_only and not profile.rule.last_reply_only:
        profile = replace(profile, rule=replace(profile.rule, last_reply_only=True))
    return profile


def record_episodes(conv: Conversation, profile: TemplateProfile, tok: HFTokenizer, max_tokens: int | None,
                    where: str = "") -> RecordEpisodes:
    """Render one record with the template under the length filter. Raises ``RecordError``:
    what the render raises, ``too_long``, and ``rule_mismatch`` when the mask the template
    renders is not the one its stored rule re-derives from the ids (verify and pack could
    not prove it, so it is not written)."""
    replies = [i for i, t in enumerate(conv.turns) if t.role == "assistant"]
    trained = trained_replies(conv)
    if trained != replies and not profile.rule.last_reply_only:
        k = next(i for i in replies if i not in trained)
        raise RecordError("untrained_turn", f"assistant message {k} is context (weight 0 or train false), but a chat "
                          f"template's mask rule finds every reply by its header and would train it, so verify could "
                          f"not prove the mask; drop the turn or move it into the user's text, or prepare with "
                          f"--train-on last (each episode then trains only its last reply)", where)
    out, dropped = render_within(conv, profile, tok, max_tokens, where)
    for i, ep in enumerate(out.episodes):
        if ep.rule_mismatch is not None:
            p = ep.rule_mismatch
            which = f"episode {i + 1} of {len(out.episodes)} (one per reply: {out.per_reply}), " if out.per_reply else ""
            trained = "trains" if ep.mask[p] else "leaves untrained"
            raise RecordError("rule_mismatch", f"{which}token {p} ({tok.token_text(int(ep.ids[p]))!r}): the template's "
                              f"render {trained} it, the mask rule learned from chat template {profile.template.name} "
                              f"does not; verify and pack re-derive masks with that rule, so this record cannot be "
                              f"proven and is not written", where)
    return RecordEpisodes(out.episodes, out.per_reply, dropped)


def template_summary(tok: HFTokenizer, profile: TemplateProfile) -> dict:
    """The tokenizer and template summary ``dataset_metadata.json`` records (``mask_rule``
    as ``tokenizer_state.json`` records it, so that verify compares the two)."""
    t = profile.template
    return {**tok.summary(), "template": {"name": t.name, "source": t.source, "sha256": t.sha256},
            "mask_rule": profile.rule.state()}

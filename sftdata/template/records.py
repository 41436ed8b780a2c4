"""What prepare asks of a chat template: the profile chosen by ``--chat-template``, and each
record's episodes under the length filter, refused when the stored rule cannot prove them.

    >>> profile = model_profile(tok, "llama3")                       # once, in the driver
    >>> eps = record_episodes(conv, profile, tok, max_tokens, where)  # per record, in a worker
    >>> eps.episodes, eps.per_reply, eps.pairs_dropped
"""

from __future__ import annotations

from dataclasses import dataclass

from ..conversation import Conversation
from ..errors import RecordError
from ..hf_tokenizer import HFTokenizer
from .chat_template import load_chat_template
from .episodes import Episode
from .fit import render_within
from .profile import TemplateProfile, learn_profile


@dataclass(frozen=True)
class RecordEpisodes:
    """A record's episodes; ``per_reply``: served one episode per assistant reply (why),
    ``pairs_dropped``: trailing pairs the length filter dropped."""

    episodes: tuple[Episode, ...]
    per_reply: str | None
    pairs_dropped: int


def model_profile(tok: HFTokenizer, spec: str | None, variables: dict | None = None) -> TemplateProfile:
    """The profile of the template ``spec`` names (``model``, ``model:NAME``, a preset, a
    ``.jinja`` file; None: the tokenizer folder's own), learned with ``tok``. Raises
    ``TemplateError`` (a folder without a template names the presets)."""
    return learn_profile(load_chat_template(spec, tok), tok, variables)


def record_episodes(conv: Conversation, profile: TemplateProfile, tok: HFTokenizer, max_tokens: int | None,
                    where: str = "") -> RecordEpisodes:
    """Render one record with the template under the length filter. Raises ``RecordError``:
    what the render raises, ``too_long``, and ``rule_mismatch`` when the mask the template
    renders is not the one its stored rule re-derives from the ids (verify and pack could
    not prove it, so it is not written)."""
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
    """The tokenizer and template summary ``dataset_metadata.json`` records."""
    t = profile.template
    return {**tok.summary(), "chat_template": {"name": t.name, "source": t.source, "sha256": t.sha256},
            "tool_arguments": profile.arguments, "last_reply_only": profile.rule.last_reply_only}

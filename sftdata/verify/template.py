"""``verify``'s check of a chat template's recorded rule: learned again from the template
text, the ``--template-var`` variables and the per-reply choice ``tokenizer_state.json``
records, with the tokenizer it names, the mask rule (headers, end-of-turn ids, whether
the end is trained) and the stop token appended after an unclosed last reply must be the
recorded ones. So a rule edited by hand, or variables that were not the ones used, fail
verify, and the recorded state is shown to re-derive every mask.

``--train-on last`` marks the recorded rule ``last_reply_only`` after learning: a recorded
rule may train fewer replies than the one learned again, never more.
"""

from __future__ import annotations

from ..errors import SftDataError
from ..store.format import RECREATE, TOKENIZER_FILE, Problem
from ..template import ChatTemplate, learn_profile


def rederived_rule_problems(state: dict, tok) -> list[Problem]:
    """The problems of a template's recorded rule against the rule learned again (none when
    they agree; none either when the state records no template text to learn from)."""
    ct = state.get("chat_template")
    if not isinstance(ct, dict) or not isinstance(ct.get("text"), str):
        return []
    variables = ct.get("variables") if isinstance(ct.get("variables"), dict) else {}
    try:
        profile = learn_profile(ChatTemplate(str(ct.get("name")), str(ct.get("source")), ct["text"]), tok, variables,
                                bool(ct.get("per_reply", False)))
    except SftDataError as e:
        return [Problem("tokenizer", TOKENIZER_FILE, "", f"the recorded chat template does not learn again with its "
                        f"recorded variables: {e}", RECREATE, code="template_rule")]
    want = profile.rule.state()
    got = state.get("mask_rule") or {}
    want["last_reply_only"] = want["last_reply_only"] or got.get("last_reply_only") is True
    want.setdefault("joined_spans", False)
    differs = [k for k in ("headers", "end_ids", "end_inclusive", "last_reply_only") if got.get(k) != want[k]]
    if "asked" in got and got["asked"] != want.get("asked", []):  # a rule recorded before it existed has none
        differs.append("asked")
    differs += ["end_seqs"] if got.get("end_seqs", []) != want.get("end_seqs", []) else []
    if got.get("joined_spans", False) != want.get("joined_spans", False):
        differs.append("joined_spans")
    if ct.get("appended_stop", None) != profile.appended_stop:
        differs.append("appended_stop")
    if not differs:
        return []
    return [Problem("tokenizer", TOKENIZER_FILE, "", f"the mask rule learned again from the recorded chat template "
                    f"{ct.get('name')} and its variables {variables} differs from the recorded one in "
                    f"{', '.join(differs)}: the masks cannot be shown to be the template's", RECREATE,
                    code="template_rule")]

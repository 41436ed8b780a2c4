"""What ``prepare-pref`` and ``prepare-rl`` take: ``PrefOptions``, its fields, checks and
build-key entries those of ``sftdata.options`` (declared once, for every build command)."""

from __future__ import annotations

from dataclasses import dataclass

from ..options.declared import DeclaredOptions, declared_fields
from ..template import DEFAULT_MAX_STEPS
from .truncate import Truncation


@dataclass(frozen=True)
@declared_fields("pref")
class PrefOptions(DeclaredOptions):
    """What ``prepare-pref`` and ``prepare-rl`` are given (``sftdata.options.declared``), and
    ``truncation``: --max-length, --max-prompt-length and --truncation as one policy."""

    truncation: Truncation = Truncation()
    family = "pref"

    @classmethod
    def from_recorded(cls, o: dict) -> PrefOptions:
        """The options a dataset's metadata records (``recorded()``), for verify to render again."""
        t, limits = o.get("truncation") or {}, o.get("template_limits") or {}
        same = {k: v for k, v in o.items() if k in cls.__dataclass_fields__ and k not in ("truncation", "decontaminate")}
        return cls(**same, form=o.get("format", "auto"), decontaminate=tuple(o.get("decontaminate", ())),
                   template_max_steps=limits.get("max_steps", DEFAULT_MAX_STEPS), template_max_output=limits.get("max_output"),
                   truncation=Truncation(t.get("max_length"), t.get("max_prompt_length"), t.get("policy", "keep-end")))

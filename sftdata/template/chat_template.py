"""Which chat template: a model folder's own, a built-in preset, or a ``.jinja`` file.

    >>> t = load_chat_template("llama3")                 # a preset
    >>> t = load_chat_template("model", tok)             # the tokenizer folder's own
    >>> t = load_chat_template("model:tool_use", tok)    # one of its named templates
    >>> t = load_chat_template("my_template.jinja")      # a file
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import TemplateError
from ..tokenize.hf import HFTokenizer
from .environment import Rendered, compile_template, has_generation_blocks, render
from .limits import DEFAULT_LIMITS, TemplateLimits
from .presets import PRESETS


@dataclass(frozen=True)
class ChatTemplate:
    """A template's text and where it came from (``source``: preset, model or file), and
    the limits every render of it runs under."""

    name: str
    source: str
    text: str
    limits: TemplateLimits = DEFAULT_LIMITS

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def has_generation_blocks(self) -> bool:
        return has_generation_blocks(self.text)

    def compiled(self):
        """The compiled template (compiled once per process, cached by text)."""
        return compile_template(self.text, self.name)

    def render(self, messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt: bool = False,
               variables: dict | None = None) -> Rendered:
        return render(self.compiled(), messages, tools=tools, add_generation_prompt=add_generation_prompt,
                      variables=variables, name=self.name, limits=self.limits)

    def state(self) -> dict:
        return {"name": self.name, "source": self.source, "sha256": self.sha256, "text": self.text}


def load_chat_template(spec: str | None, tok: HFTokenizer | None = None) -> ChatTemplate:
    """``spec``: ``None``/``"model"`` (the tokenizer's own, its ``default`` when it has
    several), ``"model:NAME"``, a preset name, or a path to a template file."""
    presets = ", ".join(sorted(PRESETS))
    if spec is None or spec == "model" or spec.startswith("model:"):
        wanted = spec.split(":", 1)[1] if spec and ":" in spec else None
        own = tok.chat_templates if tok is not None else {}
        if not own:
            where = tok.path if tok is not None else "no tokenizer"
            raise TemplateError(f"the tokenizer ({where}) ships no chat template; pass --chat-template with a "
                                f"preset ({presets}) or a .jinja file")
        if wanted is None:
            wanted = "default" if "default" in own or len(own) != 1 else next(iter(own))
        if wanted not in own:
            raise TemplateError(f"the tokenizer's config has no chat template named {wanted!r}; it has: "
                                f"{', '.join(own)}")
        name = "model" if wanted == "default" else f"model:{wanted}"
        template = ChatTemplate(name, "model", own[wanted])
    elif spec in PRESETS:
        template = ChatTemplate(spec, "preset", PRESETS[spec])
    else:
        path = Path(spec)
        if not path.is_file():
            raise TemplateError(f"chat template {spec!r} is neither a preset ({presets}), 'model', nor an "
                                f"existing file")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise TemplateError(f"cannot read chat template {path}: {e}") from None
        template = ChatTemplate(path.name, "file", text)
    template.compiled()  # a syntax error is reported now, naming the template
    return template

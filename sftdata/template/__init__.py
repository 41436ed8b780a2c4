"""A model's own chat template: sandboxed Jinja rendering (``environment``), built-in
presets (``presets``), assistant-span finding in the whole render (``spans``), the mask
rule re-derivable from token ids (``rule``), learned once per template (``profile``) and
applied per conversation (``episodes``). Needs the ``hf`` extra (jinja2, tokenizers).
"""

from .chat_template import ChatTemplate, load_chat_template
from .environment import Rendered, compile_template, has_generation_blocks, render
from .episodes import Episode, TemplateRender, check_texts, render_conversation, render_messages, tokenizer_state
from .messages import ArgumentsStyle, arguments_style, conversation_messages, tool_schemas
from .presets import PRESET_TOKENS, PRESETS
from .profile import TemplateProfile, learn_profile
from .rule import MaskRule, mask_disagreement, rule_mask, rule_spans
from .spans import Layout, NotLocated, locate_last_reply, locate_replies, token_mask, token_ranges

__all__ = [
    "PRESETS", "PRESET_TOKENS", "ArgumentsStyle", "ChatTemplate", "Episode", "Layout", "MaskRule", "NotLocated",
    "Rendered", "TemplateProfile", "TemplateRender", "arguments_style", "check_texts", "compile_template",
    "conversation_messages", "has_generation_blocks", "learn_profile", "load_chat_template", "locate_last_reply",
    "locate_replies", "mask_disagreement", "render", "render_conversation", "render_messages", "rule_mask",
    "rule_spans", "token_mask", "token_ranges", "tokenizer_state", "tool_schemas",
]

"""A model's own chat template: sandboxed Jinja rendering (``environment``), built-in
presets (``presets``), the limits every render runs under (``limits``, counted by
``sandbox``), assistant-span finding in the whole render (``spans``), the mask
rule re-derivable from token ids (``rule``), learned once per template (``profile``) and
applied per conversation (``episodes``) or to a chunk of them at once (``chunk``), under
the length filter (``fit``), and what prepare asks per record (``records``). Needs the ``hf`` extra (jinja2, tokenizers).
"""

from ..chat.template_rule import MaskRule, mask_disagreement, rule_mask, rule_spans, segment_rule_mask
from .chat_template import ChatTemplate, load_chat_template
from .chunk import chunk_episodes
from .environment import Rendered, compile_template, has_generation_blocks, render
from .episodes import (
    Episode,
    Planned,
    TemplateRender,
    check_texts,
    episodes_of,
    plan_conversation,
    render_conversation,
    render_messages,
    tokenizer_state,
)
from .fit import render_within
from .learn import learn_profile
from .limits import DEFAULT_MAX_STEPS, TemplateLimits
from .messages import ArgumentsStyle, arguments_style, conversation_messages, tool_schemas
from .presets import PRESET_TOKENS, PRESETS
from .profile import TemplateProfile
from .records import (
    RecordEpisodes,
    choose_tokenizer,
    fit_to_template,
    model_profile,
    open_for_build,
    plan_record,
    record_episodes,
    records_episodes,
    require_tool_calls,
    template_summary,
)
from .spans import Layout, NotLocated, locate_last_reply, locate_replies, token_mask, token_ranges

__all__ = [
    "DEFAULT_MAX_STEPS", "PRESETS", "PRESET_TOKENS", "ArgumentsStyle", "ChatTemplate", "Episode", "Layout", "MaskRule",
    "NotLocated", "Planned", "RecordEpisodes", "Rendered", "TemplateLimits", "TemplateProfile", "TemplateRender",
    "arguments_style", "check_texts", "choose_tokenizer",
    "chunk_episodes", "episodes_of", "plan_conversation",
    "compile_template", "conversation_messages", "has_generation_blocks", "learn_profile", "load_chat_template",
    "locate_last_reply", "locate_replies", "mask_disagreement", "model_profile", "record_episodes", "records_episodes", "render",
    "render_conversation", "render_messages", "render_within", "rule_mask", "rule_spans", "segment_rule_mask",
    "template_summary", "token_mask", "token_ranges", "tokenizer_state", "tool_schemas", "fit_to_template",
    "open_for_build", "plan_record", "require_tool_calls",
]

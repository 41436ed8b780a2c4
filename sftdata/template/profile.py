"""A chat template's profile: what marks an assistant reply (``layout``), the mask rule
over token ids, how tool-call arguments and message content go in, and which capabilities
(system, tools, reasoning) it carries, learned once per (template, tokenizer) by
``learn.learn_profile``; ``state()`` goes into ``tokenizer_state.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..chat.template_rule import MaskRule
from ..records.turns import Conversation, Turn
from .chat_template import ChatTemplate
from .messages import ArgumentsStyle, ContentStyle, conversation_messages
from .spans import Layout

MAX_CACHED_RENDERS = 4096


CAPABILITIES = ("system", "tools", "reasoning")


@dataclass(frozen=True)
class TemplateProfile:
    """Everything rendering needs besides the conversation; ``state()`` goes into
    ``tokenizer_state.json``. ``user_variables``: the ``--template-var`` values (in
    ``variables`` with the tokenizer's token strings); ``unsupported``: each capability
    the template cannot carry, and why; ``renders_tool_calls``: a tool call's name appears
    in the template's render at all; ``appended_stop``: the token appended after a last
    reply the template closes with none (None: it always closes them)."""

    template: ChatTemplate
    variables: dict = field(hash=False)
    generation: bool
    generation_prompt: str
    layout: Layout
    rule: MaskRule
    arguments: ArgumentsStyle
    arguments_reason: str
    content: ContentStyle = "string"
    unsupported: dict = field(default_factory=dict, hash=False)
    renders_tool_calls: bool = True
    ignores_tool_schemas: bool = False  # it renders calls but never a schema, and the same text without them
    appended_stop: str | None = None
    user_variables: dict = field(default_factory=dict, hash=False)
    replies_alone: bool = False  # every record served one episode per reply (learned, or --per-reply)
    reasoning: str = "none"  # where it renders reasoning_content: every reply's, the last one's, none
    # unsupported capabilities whose probes render, but a reply of which no token marks the
    # start (Apertus writes the reply after a tool result right after it): records needing
    # them are rejected as reply_not_located
    unlocated: frozenset = frozenset()
    # a vision model's processor settings (``media.read_processor_settings``), pinned in
    # tokenizer_state.json, and the token id of each kind's placeholder (``vision.with_processor``)
    processor: dict | None = field(default=None, hash=False)
    media_ids: dict = field(default_factory=dict, hash=False)
    # sentinel renders by conversation structure (``sentinel_fn``); per process, never compared
    renders: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def tools_supported(self) -> bool:
        return "tools" not in self.unsupported

    def supports(self, capability: str) -> bool:
        return capability not in self.unsupported

    def messages(self, conv: Conversation, turns: tuple[Turn, ...] | None = None) -> list[dict]:
        """``conv``'s message dicts as this template reads them (``turns``: these instead of its own)."""
        return conversation_messages(conv, self.arguments, self.content, turns)

    def render_fn(self, tools: list[dict] | None = None, kwargs: dict | None = None):
        """Render messages (``kwargs``: a record's own template variables over the profile's),
        the appended stop after a last reply the template leaves unclosed."""
        variables = {**self.variables, **kwargs} if kwargs else self.variables
        stop, ends = self.appended_stop, self.layout.end_texts

        def fn(messages, add_generation_prompt=False):
            text = self.template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                        variables=variables).text
            if stop is not None and not add_generation_prompt and not text.rstrip().endswith(ends):
                text += stop
            return text
        return fn

    def sentinel_fn(self, tools: list[dict] | None = None, kwargs: dict | None = None):
        """``render_fn`` for the sentinel copies of conversations, cached: such a render
        depends on the conversation's structure alone (roles, tool calls, tools), which few
        records of a corpus differ in, so most records need one render instead of two."""
        plain = self.render_fn(tools, kwargs)
        tools_key = (repr(tools), repr(kwargs))

        def fn(messages, add_generation_prompt=False, key=None):
            """``key``: the messages' ``plain_structure`` (they are then looked up by it)."""
            key = (repr(messages) if key is None else key, tools_key, add_generation_prompt)
            text = self.renders.get(key)
            if text is None:
                if len(self.renders) >= MAX_CACHED_RENDERS:
                    self.renders.clear()
                text = self.renders[key] = plain(messages, add_generation_prompt)
            return text

        fn.cached = lambda key: self.renders.get((key, tools_key, False))  # None: not rendered yet
        return fn

    def __getstate__(self):
        state = dict(self.__dict__)
        state["renders"] = {}  # a worker builds its own
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    def state(self) -> dict:
        return {"chat_template": {**self.template.state(), "generation_blocks": self.generation,
                                  "generation_prompt": self.generation_prompt,
                                  "header_texts": list(self.layout.header_texts),
                                  "end_texts": list(self.layout.end_texts),
                                  "appended_stop": self.appended_stop,
                                  "variables": self.user_variables,
                                  "capabilities": {c: self.unsupported.get(c, "supported") for c in CAPABILITIES},
                                  "renders_tool_calls": self.renders_tool_calls,
                                  "tool_schemas": "ignored" if self.ignores_tool_schemas else "rendered",
                                  "content": self.content,
                                  "per_reply": self.replies_alone,
                                  "reasoning_position": self.reasoning},
                "mask_rule": self.rule.state(),
                "tool_arguments": {"style": self.arguments, "reason": self.arguments_reason},
                **({"processor": self.processor} if self.processor is not None else {})}

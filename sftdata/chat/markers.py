"""sftdata's chat markers: the special tokens that open and close each span of a rendered
conversation, and their ids in one tokenizer (``MarkerIds``, the one thing masking,
packing and the structural checks need to know).

The first six (``CHAT_MARKERS``) mark spans; ``<|EOS|>`` ends an episode; the markers
added later (``ADDED_MARKERS``: reasoning, untrained assistant turns) come after them, so
the ids of the first six and of EOS never move. A dataset written before the added
markers existed records the six only (docs/FORMAT.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TokenizerError

CHAT_MARKERS = ("<|SYSTEM|>", "<|USER|>", "<|ASSISTANT|>", "<|TOOL|>", "<|TOOL_CALL|>", "<|END|>")
# reasoning inside an assistant span, and the opener of an assistant turn that is shown, never trained
ADDED_MARKERS = ("<|THINK|>", "<|END_THINK|>", "<|ASSISTANT_CONTEXT|>")
MARKERS = CHAT_MARKERS + ADDED_MARKERS
EOS = "<|EOS|>"


@dataclass(frozen=True)
class MarkerIds:
    """The ids of the chat markers; the one thing masking and packing need to know."""

    system: int
    user: int
    assistant: int
    tool: int
    tool_call: int
    end: int
    eos: int
    # None in a dataset written before these markers existed
    think: int | None = None
    end_think: int | None = None
    assistant_context: int | None = None

    @classmethod
    def from_special_tokens(cls, special: dict[str, int]) -> MarkerIds:
        try:
            return cls(
                system=special["<|SYSTEM|>"],
                user=special["<|USER|>"],
                assistant=special["<|ASSISTANT|>"],
                tool=special["<|TOOL|>"],
                tool_call=special["<|TOOL_CALL|>"],
                end=special["<|END|>"],
                eos=special[EOS],
                think=special.get("<|THINK|>"),
                end_think=special.get("<|END_THINK|>"),
                assistant_context=special.get("<|ASSISTANT_CONTEXT|>"),
            )
        except KeyError as e:
            raise TokenizerError(
                f"special_tokens lacks {e.args[0]}; it must hold every marker {CHAT_MARKERS} and {EOS}"
            ) from None

    def as_dict(self) -> dict[str, int]:
        """Marker string -> id, for the markers this dataset has (EOS last)."""
        out = {
            "<|SYSTEM|>": self.system,
            "<|USER|>": self.user,
            "<|ASSISTANT|>": self.assistant,
            "<|TOOL|>": self.tool,
            "<|TOOL_CALL|>": self.tool_call,
            "<|END|>": self.end,
        }
        for name, v in zip(ADDED_MARKERS, (self.think, self.end_think, self.assistant_context)):
            if v is not None:
                out[name] = v
        out[EOS] = self.eos
        return out

    def name(self, token_id: int) -> str | None:
        """The marker string of ``token_id`` (``"<|USER|>"``, ``"<|EOS|>"`` ...), or None
        when it is no marker: the one id-to-name lookup messages and views use."""
        return next((k for k, v in self.as_dict().items() if v == int(token_id)), None)

"""Where a chat template renders a reply's ``reasoning_content``: every reply's, only the
last one's (the reply being generated), or none. Learned once per template, beside the
other probes (``learn.learn_profile``), and recorded in ``tokenizer_state.json`` →
``chat_template.reasoning_position``.

* ``every``: every reply's reasoning is in the whole render, trained with its reply;
* ``last``: only the last reply's (gpt-oss's analysis channel, Qwen3's think block after
  the last user message, GLM, MiniMax M2, DeepSeek V3.2 with ``thinking``): earlier
  turns' reasoning is dropped from the whole render, so a record holding it is exact one
  reply at a time (``episodes``), never stripped;
* ``none``: the field is never read (Llama, Gemma, Mistral): reasoning is dropped and
  counted (``records.fit_to_template``: ``reasoning_ignored_by_template``).
"""

from __future__ import annotations

from ..errors import TemplateError, TemplateLimitError
from ..records.turns import Conversation, Turn

# two replies with reasoning: where the template writes each one's reasoning_content
_POSITION_PROBE = Conversation((Turn("user", "What is 2+2?"), Turn("assistant", "4.", reasoning="Two and two make four."),
                                Turn("user", "And 3+3?"), Turn("assistant", "6.", reasoning="Three and three make six.")))
REASONING_POSITIONS = ("every", "last", "none")


def reasoning_position(render_full, probe) -> str:
    """Where the template writes a reply's ``reasoning_content`` (``probe``: a Conversation
    -> messages and tools as the template reads them): ``every`` reply's (Bielik 3, Cohere2
    MoE, MiniMax M3), only the ``last`` one's, the reply being generated (gpt-oss,
    Qwen3 and DeepSeek V3.2 drop earlier turns' reasoning; Qwen3 keeps that of the replies
    after the last user message), or ``none`` (Llama, Gemma, Mistral: the field is never
    read). Decided on the render of two exchanges whose replies both carry reasoning, then
    of the first exchange alone (its reply last)."""
    messages, tools = probe(_POSITION_PROBE)
    first, second = (t.reasoning for t in _POSITION_PROBE.turns if t.reasoning)
    try:
        whole = render_full(messages, tools).text
        if first in whole and second in whole:
            return "every"
        if second in whole or first in render_full(messages[:2], tools).text:
            return "last"
    except TemplateLimitError:  # past its limits: refused, never taken as refusing
        raise
    except TemplateError:
        pass
    return "none"

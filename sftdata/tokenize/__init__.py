"""Tokenizers behind one interface: tiktoken encodings and ranks files, Hugging Face
``tokenizer.json`` files, the fast BPE path and its proof, the memo of encoded texts and the
cache of converted tables.

What a ``tokenizer_state.json`` says it is, defined once here (and read by the mask rule
and the loader without loading any tokenizer): every state has ``format`` ``STATE_FORMAT``;
a model's own tokenizer (and chat template) has ``kind`` ``HF_KIND``, sftdata's tiktoken
tokenizer with chat markers has no kind.
"""

STATE_FORMAT = "sftdata-tokenizer"
HF_KIND = "hf-tokenizers"


def is_hf_state(state) -> bool:
    """True when a recorded tokenizer state is a model's own tokenizer (and template)."""
    return isinstance(state, dict) and state.get("kind") == HF_KIND

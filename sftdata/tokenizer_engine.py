"""Which engine encodes a model's ``tokenizer.json``, and why: tiktoken's BPE core where the
file is byte-level BPE it can run and the self-check proves the ids equal (``fast_bpe``,
``bpe_check``), else the ``tokenizers`` library.

``--tokenizer-engine``: ``auto`` (the default) takes tiktoken when it is proven, else the
library, saying why; ``tiktoken`` insists (an error says why it cannot); ``hf`` always
uses the library.

    >>> choice = choose_engine("auto", doc, sha256, library, added, "llama3")
    >>> choice.engine, choice.reason
    ('tiktoken', 'byte-level BPE with one split regex: ids proven equal to the tokenizers library at load')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .bpe_check import self_check
from .errors import TokenizerError, UsageError
from .fast_bpe import FastBPE, load_fast_bpe

ENGINES = ("auto", "tiktoken", "hf")
FAST, LIBRARY = "tiktoken", "hf"
PROVEN = "byte-level BPE with one split regex: ids proven equal to the tokenizers library at load"


@dataclass
class EngineChoice:
    """The engine that runs (``tiktoken`` or ``hf``), why, the evidence, and the fast encoder."""

    engine: str
    reason: str
    requested: str = "auto"
    evidence: dict = field(default_factory=dict)
    fast: FastBPE | None = None

    def record(self) -> dict:
        """What ``tokenizer_state.json`` and the prepare summary record."""
        return {"engine": self.engine, "requested": self.requested, "reason": self.reason,
                "evidence": self.evidence}


def check_engine(name: str) -> str:
    if name not in ENGINES:
        raise UsageError(f"--tokenizer-engine must be one of {', '.join(ENGINES)}, not {name!r}")
    return name


def choose_engine(requested: str, doc: dict, file_sha256: str, library, added_tokens: Sequence[str],
                  name: str = "hf") -> EngineChoice:
    """The engine for a loaded ``tokenizer.json`` (``doc`` parsed, ``library`` the
    ``tokenizers.Tokenizer`` without post-processor). Raises ``TokenizerError`` when
    ``tiktoken`` is requested and cannot be proven."""
    check_engine(requested)
    if requested == LIBRARY:
        return EngineChoice(LIBRARY, "--tokenizer-engine hf", requested)
    try:
        import tiktoken  # noqa: F401  (a dependency of sftdata; checked for a clear message)
    except ImportError:  # pragma: no cover - dependency missing
        return _refused(requested, "tiktoken is not installed")
    fast, why = load_fast_bpe(doc, file_sha256, name)
    if fast is None:
        return _refused(requested, f"not byte-level BPE tiktoken can run: {why}")
    evidence, mismatch = self_check(fast, library, added_tokens)
    if mismatch is not None:
        return _refused(requested, f"the self-check found a difference: {mismatch}")
    return EngineChoice(FAST, PROVEN, requested, {**fast.evidence, "self_check": evidence}, fast)


def _refused(requested: str, why: str) -> EngineChoice:
    if requested == FAST:
        raise TokenizerError(f"--tokenizer-engine tiktoken cannot encode this tokenizer.json: {why}. Use "
                             f"--tokenizer-engine auto (or hf) to encode with the tokenizers library")
    return EngineChoice(LIBRARY, why, requested)

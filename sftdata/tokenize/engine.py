"""Which engine encodes a model's ``tokenizer.json``, and why: tiktoken's BPE core where the
file is byte-level BPE it can run and the self-check proves the ids equal (``fast_bpe``,
``bpe_check``), else the ``tokenizers`` library.

The self-check's result is kept in the user's cache beside the conversion, keyed by the
file's sha256 and valid for the same tiktoken and tokenizers versions and the same check
texts: a second start neither converts nor checks again, and never loads the library
(``tokenizer_state.json`` records the evidence, ``cached_proof`` saying so).

``--tokenizer-engine``: ``auto`` (the default) takes tiktoken when it is proven, else the
library, saying why; ``tiktoken`` insists (an error says why it cannot); ``hf`` always
uses the library.

    >>> choice = choose_engine("auto", lambda: doc, sha256, library, added, "llama3")
    >>> choice.engine, choice.reason
    ('tiktoken', 'byte-level BPE with one split regex: ids proven equal to the tokenizers library at load')
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import TokenizerError, UsageError
from .bpe_check import self_check, self_check_texts
from .fast_bpe import FastBPE, load_fast_bpe, remember_proof

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
        """What ``tokenizer_state.json`` records (the same whether the proof came from the
        cache or was just made, so that a dataset's files do not depend on the cache)."""
        check = {k: v for k, v in (self.evidence.get("self_check") or {}).items() if k != "cached_proof"}
        evidence = {**self.evidence, "self_check": check} if check else self.evidence
        return {"engine": self.engine, "requested": self.requested, "reason": self.reason, "evidence": evidence}


def check_engine(name: str) -> str:
    if name not in ENGINES:
        raise UsageError(f"--tokenizer-engine must be one of {', '.join(ENGINES)}, not {name!r}")
    return name


def proof_key(added_tokens: Sequence[str]) -> dict:
    """What a cached self-check result is valid for: both engines' versions and the texts."""
    import tiktoken
    import tokenizers

    texts = "\x00".join(self_check_texts(list(added_tokens))).encode("utf-8", "surrogatepass")
    return {"tiktoken": tiktoken.__version__, "tokenizers": tokenizers.__version__,
            "texts_sha256": hashlib.sha256(texts).hexdigest()}


def choose_engine(requested: str, doc: Callable[[], dict], file_sha256: str, library: Callable[[], object],
                  added_tokens: Sequence[str], name: str = "hf") -> EngineChoice:
    """The engine for a loaded ``tokenizer.json`` (``doc()`` gives it parsed, called only
    when the conversion is not in the cache; ``library()`` gives the ``tokenizers.Tokenizer``
    without post-processor, loaded only when the self-check must run). Raises
    ``TokenizerError`` when ``tiktoken`` is requested and cannot be proven."""
    check_engine(requested)
    if requested == LIBRARY:
        return EngineChoice(LIBRARY, "--tokenizer-engine hf", requested)
    try:
        import tiktoken  # noqa: F401  (a dependency of sftdata; checked for a clear message)
    except ImportError:  # pragma: no cover - dependency missing
        return _refused(requested, "tiktoken is not installed")
    fast, why, entry = load_fast_bpe(doc, file_sha256, name)
    if fast is None:
        return _refused(requested, f"not byte-level BPE tiktoken can run: {why}")
    key = proof_key(added_tokens)
    proof = entry[0].get("proof")
    if isinstance(proof, dict) and proof.get("key") == key and proof.get("mismatch", "") is None:
        evidence = {**proof["evidence"], "cached_proof": True}
    else:
        evidence, mismatch = self_check(fast, library(), added_tokens)
        remember_proof(file_sha256, entry, {"key": key, "evidence": evidence, "mismatch": mismatch})
        if mismatch is not None:
            return _refused(requested, f"the self-check found a difference: {mismatch}")
        evidence = {**evidence, "cached_proof": False}
    combined = fast.evidence.get("split_regexes")  # a chain of Split regexes run as one pattern
    reason = PROVEN.replace("one split regex", f"one split regex ({combined})") if combined else PROVEN
    return EngineChoice(FAST, reason, requested, {**fast.evidence, "self_check": evidence}, fast)


def _refused(requested: str, why: str) -> EngineChoice:
    if requested == FAST:
        raise TokenizerError(f"--tokenizer-engine tiktoken cannot encode this tokenizer.json: {why}. Use "
                             f"--tokenizer-engine auto (or hf) to encode with the tokenizers library")
    return EngineChoice(LIBRARY, why, requested)

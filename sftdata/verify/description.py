"""The tokenizer check of ``verify``, and ``Vocab``: what the content checks need to
know of the tokenizer (its markers and vocabulary size)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SftDataError
from ..store import RECREATE, TOKENIZER_FILE, Problem, Scan
from ..store.reader import markers_from_state
from ..tokenizer import MarkerIds, load_tokenizer, tokenizer_from_state


@dataclass(frozen=True)
class Vocab:
    markers: MarkerIds
    size: int


def vocab_from_state(state: dict | None) -> Vocab | None:
    """The recorded markers and vocabulary size, without rebuilding the tokenizer."""
    markers = markers_from_state(state)
    try:
        return None if markers is None else Vocab(markers, int(state["vocab_size"]))
    except (KeyError, TypeError, ValueError):
        return None


@dataclass
class TokenizerCheck:
    """The tokenizer check's verdict: the vocabulary the content checks use (None: they
    cannot run), its problems, and a note for the report."""

    vocab: Vocab | None
    problems: list[Problem] = field(default_factory=list)
    note: str | None = None
    unknown: bool = False  # no tokenizer at all: vocab, eos and mask_rule are skipped


def check_tokenizer(scan: Scan, tokenizer: str | None) -> TokenizerCheck:
    """The tokenizer the ids were made with rebuilds, with the recorded ranks hash.
    ``tokenizer`` names one for an older flat layout, which records none."""
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        return TokenizerCheck(Vocab(tok.ids, tok.vocab_size),
                              note=f"token ids, EOS endings and the mask rule checked with --tokenizer {tokenizer}")
    if not scan.tokenizer_file:
        if scan.dataset.layout == "sharded":
            return TokenizerCheck(None, [Problem("tokenizer", TOKENIZER_FILE, "", f"{TOKENIZER_FILE} is missing: the "
                                                 "tokenizer the ids were made with is unknown", RECREATE)],
                                  unknown=True)
        return TokenizerCheck(None, note=f"no {TOKENIZER_FILE}: token ids, EOS endings and the loss mask cannot be "
                                         "checked (pass --tokenizer NAME to check them with a known tokenizer)",
                              unknown=True)
    state = scan.dataset.tokenizer_state
    if state is None:  # unreadable: the reader reported it
        return TokenizerCheck(None)
    try:
        tok = tokenizer_from_state(state, TOKENIZER_FILE)
        return TokenizerCheck(Vocab(tok.ids, tok.vocab_size))
    except SftDataError as e:
        problem = Problem("tokenizer", TOKENIZER_FILE, "", str(e),
                          "use the encoding or ranks file the dataset was prepared with")
        return TokenizerCheck(vocab_from_state(state), [problem])  # the recorded ids still allow the other checks

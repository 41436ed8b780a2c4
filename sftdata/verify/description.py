"""The tokenizer check of ``verify``, and ``Vocab``: what the content checks need to
know of the tokenizer (its mask rule and vocabulary size).

Two kinds of ``tokenizer_state.json``: a tiktoken encoding with sftdata's chat markers
(rebuilt from its name or ranks file, its ranks hash compared), and a model's own
``tokenizer.json`` with its chat template (``kind: "hf-tokenizers"``: the file's sha256
compared when the file is still at its recorded path; the mask rule and the vocabulary
size are in the state itself, so the content checks run either way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SftDataError
from ..hf_tokenizer import hf_tokenizer_from_state
from ..loss_rule import LossRule, MarkerRule, is_template_state, rule_from_state
from ..store import RECREATE, TOKENIZER_FILE, Problem, Scan
from ..tokenizer import load_tokenizer, tokenizer_from_state


@dataclass(frozen=True)
class Vocab:
    rule: LossRule
    size: int

    @property
    def markers(self):
        """The chat markers (a marker rule only): the EOS check of an older flat layout."""
        return self.rule.markers


def vocab_from_state(state: dict | None) -> Vocab | None:
    """The recorded mask rule and vocabulary size, without rebuilding the tokenizer."""
    try:
        rule = rule_from_state(state)
        return None if rule is None else Vocab(rule, int(state["vocab_size"]))
    except (SftDataError, KeyError, TypeError, ValueError):
        return None


@dataclass
class TokenizerCheck:
    """The tokenizer check's verdict: the vocabulary the content checks use (None: they
    cannot run), its problems, and a note for the report."""

    vocab: Vocab | None
    problems: list[Problem] = field(default_factory=list)
    note: str | None = None
    unknown: bool = False  # no tokenizer at all: vocab, eos and mask_rule are skipped
    unchecked: str | None = None  # why the tokenizer check itself was skipped (the file is not here)


def _check_template_state(state: dict) -> TokenizerCheck:
    """A model's own tokenizer: its recorded rule and size drive the content checks; the
    tokenizer.json is compared with its recorded sha256 when it is still there."""
    try:
        vocab = Vocab(rule_from_state(state, TOKENIZER_FILE), int(state["vocab_size"]))
    except SftDataError as e:
        return TokenizerCheck(None, [Problem("tokenizer", TOKENIZER_FILE, "", str(e), RECREATE)])
    except (KeyError, TypeError, ValueError):
        return TokenizerCheck(None, [Problem("tokenizer", TOKENIZER_FILE, "", f"{TOKENIZER_FILE} records no "
                                             f"integer vocab_size", RECREATE)])
    path = state.get("path")
    if not isinstance(path, str) or not Path(path).is_file():
        why = f"the tokenizer file {path} is not here" if path else f"{TOKENIZER_FILE} records no tokenizer path"
        return TokenizerCheck(vocab, note=f"{why}: its sha256 was not compared (token ids and masks were checked "
                                          f"with the vocabulary size and mask rule the dataset records)",
                              unchecked="tokenizer file not here")
    try:
        hf_tokenizer_from_state(state, TOKENIZER_FILE)
    except SftDataError as e:
        return TokenizerCheck(vocab, [Problem("tokenizer", TOKENIZER_FILE, "", str(e),
                                              "use the tokenizer.json the dataset was prepared with")])
    return TokenizerCheck(vocab)


def check_tokenizer(scan: Scan, tokenizer: str | None) -> TokenizerCheck:
    """The tokenizer the ids were made with rebuilds, with the recorded ranks hash (a
    model's tokenizer.json: the recorded file sha256). ``tokenizer`` names one for an
    older flat layout, which records none."""
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        return TokenizerCheck(Vocab(MarkerRule(tok.ids), tok.vocab_size),
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
    if is_template_state(state):
        return _check_template_state(state)
    try:
        tok = tokenizer_from_state(state, TOKENIZER_FILE)
        return TokenizerCheck(Vocab(MarkerRule(tok.ids), tok.vocab_size))
    except SftDataError as e:
        problem = Problem("tokenizer", TOKENIZER_FILE, "", str(e),
                          "use the encoding or ranks file the dataset was prepared with")
        return TokenizerCheck(vocab_from_state(state), [problem])  # the recorded ids still allow the other checks

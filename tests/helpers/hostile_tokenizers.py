"""Hostile tokenizer folders (issue 32), shared by tests/tokenize, tests/cli and
benchmarks/bench_hostile_models.py:

* ``big_tokenizer``: a valid byte-level BPE tokenizer.json of any number of merges,
  written in seconds: the "61 MB, 1.5 M merges" file (tests write small ones and lower
  the caps). Tokens are words over a few symbols of the byte-level alphabet; each merge
  joins a token with one more symbol, so every merge's parts and result are in the
  vocabulary, in the order the library reads them.
* ``split_tokenizer``: a tiny trained tokenizer whose pre-tokenizer splits with a given
  regular expression (one that backtracks, for the tests of the guard)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def big_tokenizer(folder: Path, merges: int, chat_template: str | None = None, symbols: int = 64) -> Path:
    """Write ``folder/tokenizer.json`` (and a tokenizer_config.json) with ``merges`` merges; fewer
    ``symbols`` make longer tokens (10: the 1.5 M merges take 61 MB, as in issue 32)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    chars = alphabet[-symbols:]  # Latin-1 letters: two bytes each in UTF-8
    pairs: list[str] = []
    frontier = list(chars)
    while len(pairs) < merges:
        grown = []
        for left in frontier:
            for right in chars:
                if len(pairs) == merges:
                    break
                pairs.append(f"{left} {right}")
                vocab[left + right] = len(vocab)
                grown.append(left + right)
        frontier = grown
    added = [{"id": len(vocab) + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(SPECIALS)]
    doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                               "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": pairs}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    config = {"bos_token": SPECIALS[0], "eos_token": SPECIALS[4], "pad_token": SPECIALS[1]}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def split_tokenizer(folder: Path, pattern: str) -> Path:
    """A byte-level BPE tokenizer (Llama 3's special tokens) that first splits with ``pattern``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, how are you? aaa b"] * 10, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": SPECIALS[0], "eos_token": SPECIALS[4], "pad_token": SPECIALS[1]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder

"""Verify a dataset on disk: every check, every problem as data (the CLI draws the report).

    >>> report = verify("data/chat_sft")          # all checks, checksums included
    >>> report.ok, [str(p) for p in report.problems]

The checks (``CHECKS``; ``PACKED_CHECKS`` for packed datasets, ``ROW_CHECKS`` for pairs,
KTO and prompts datasets: ``checks_for``) and what each catches; one skeleton runs them for
every kind, and what means nothing for a kind is skipped by name, with why:

* metadata, files, sizes, index, eos, counts (packed: rows, segments): the reader's
  structural checks (``store.scan_dataset``; ``store.open_dataset`` refuses a dataset
  that fails one), reported here with the rest;
* tokenizer: the tokenizer rebuilds with the ranks hash recorded at prepare time
  (``content``);
* vocab, mask_values, mask_rule: ids below the vocabulary size, mask values 0/1, and
  the mask equal to the one ``masking.loss_mask`` derives from the tokens (``content``;
  packed: per segment, and padding);
* references: packed segments against their source episodes (``references``);
* metadata_checksum, ranges (and the tokenizer identity): the metadata hashes to the
  sha256 it records, its tokenizer summary is ``tokenizer_state.json``'s, each shard's
  recorded value ranges fit the vocabulary and the data (``metadata``);
* checksums: sha256 of every file equals the metadata (skipped by ``quick``; ``shards``);
* sources (only with ``sources=True``): the input files the metadata records are present
  and unchanged, so the dataset can be reproduced from them (``sources``);
* retokenize, drift (only with ``retokenize_episodes=N``): N sampled episodes (rows)
  re-encoded by the tokenizers library, and rendered again from their input records;
* a row dataset's mask rule, KTO labels and rows rendered again (``rows``).

Every check is a pure function over what the reader returns, returning ``Problem``
records; each names the check, the file (relative to the dataset), where (episode or
row id, byte offset), what is wrong and what to do.
"""

from __future__ import annotations

from ..store.format import Problem
from .run import CHECKS, PACKED_CHECKS, ROW_CHECKS, CheckResult, ProgressFn, VerifyReport, checks_for, verify

__all__ = ["verify", "VerifyReport", "CheckResult", "Problem", "CHECKS", "PACKED_CHECKS", "ROW_CHECKS", "checks_for", "ProgressFn"]

"""Curating records at prepare time: duplicates and evaluation contamination.

Pure functions over what a chunk of records became, run in the workers (``chunk``:
each accepted record's canonical-text key, MinHash signature and contamination check),
and one decision in the driver, in input order (``dedup.Deduplicator``), so the output
is byte-identical for any number of workers (docs/CURATION.md).

- ``canonical``: a conversation's canonical text (whitespace collapsed) and its key;
- ``minhash``: token shingles, signatures (the ``rensa`` library), LSH bands;
- ``dedup``: the driver's index: first occurrence in input order kept;
- ``decontaminate``: evaluation items as word n-grams, and the records sharing one;
- ``chunk``: what the workers compute for one chunk of records.
"""

from __future__ import annotations

from .canonical import canonical_text, exact_key
from .chunk import CurateSettings, RecordKeys, chunk_keys, concat_keys, conversation_keys
from .decontaminate import DEFAULT_NGRAM, EvalIndex, build_eval_index, load_evals
from .dedup import DEDUP_MODES, DEFAULT_THRESHOLD, Deduplicator, Drop

__all__ = ["canonical_text", "exact_key", "CurateSettings", "RecordKeys", "chunk_keys", "concat_keys",
           "conversation_keys", "DEFAULT_NGRAM", "EvalIndex",
           "build_eval_index", "load_evals", "DEDUP_MODES", "DEFAULT_THRESHOLD", "Deduplicator", "Drop"]

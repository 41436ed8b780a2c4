"""Reading every kind of input as a stream of records, keeping where each came from.

* ``inputs``: what the arguments name (files, folders, globs, ``-`` for stdin, URLs);
* ``sniff``: what a file holds, from its first bytes, never its name (compression,
  text encoding, container; archives and binaries refused in one line);
* ``streams``: raw bytes (counted and hashed) -> decompressed -> UTF-8;
* ``lines`` / ``json_array`` / ``parquet``: the records of JSON Lines, a JSON array and
  Parquet, each read in bounded pieces (no record is held longer than the record bound);
* ``remote``: URLs through fsspec; ``records``: the numbering, and it all together.
"""

from ..util.hashing import sha256_file
from .inputs import STDIN, Input, expand_inputs, select_inputs
from .records import (
           DEFAULT_MAX_RECORD_BYTES,
           RawRecord,
           SourceInfo,
           inspect_source,
           iter_all,
           iter_records,
           record_where,
           too_large,
)
from .sniff import compression_of, container_of, encoding_of, refusal
from .streams import BadText

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "STDIN", "BadText", "Input", "RawRecord", "SourceInfo", "compression_of",
           "container_of", "encoding_of", "expand_inputs", "inspect_source", "iter_all", "iter_records", "record_where",
           "refusal", "select_inputs", "sha256_file", "too_large"]

"""Where a dataset's bytes are kept, safely: the commit protocol (``manifest``: the metadata
file a writer puts last, and the files it lists, which are all sftdata may ever remove),
file-system safety (``fsops``: nothing written through a link, owned folders), locks
(``lock``), what a killed run left (``leftovers``), and object storage (``objects``,
``object_cache``, ``object_commit``, ``object_upload``; ``location``: a path or a URL).
It knows no other file name of the format: ``sftdata.store`` does.

The commit protocol's names are this package's own (a reader needs them without the rest):
the metadata file, the format's name in it, the splits its manifest may list, and reading it.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from ..errors import DatasetError

FORMAT_NAME = "sftdata"
METADATA_FILE = "dataset_metadata.json"
SPLITS = ("train", "val")


def read_json(path: Path) -> dict:
    try:
        obj = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise DatasetError(f"{path} is missing") from None
    except orjson.JSONDecodeError as e:
        raise DatasetError(f"{path} is not valid JSON ({e}); the file is damaged. Re-create the dataset") from None
    if not isinstance(obj, dict):
        raise DatasetError(f"{path} holds a JSON {type(obj).__name__}, not an object")
    return obj

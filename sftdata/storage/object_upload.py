"""A task's own upload into a dataset's object-store target (``DirectUpload``): the final
shard files a worker or Ray task writes go straight to the bucket, not through the
coordinator, which uploads only the metadata and the commit (``object_commit``).

::

    coordinator: plan the shards ── ObjectCommit.open_direct(planned objects) ──► DirectUpload
                 (the lock object lists them first; an old dataset's metadata deleted first)
    task:        write the shard in its staging folder ── DirectUpload.put ──► every file put
                 (multipart past ``part_bytes``), read back and checked against its sha256,
                 the local copy removed ──► its objects' sizes back to the coordinator
    coordinator: the metadata files, then ``dataset_metadata.json`` LAST (the commit)

A task needs the store's credentials on its node (for S3: the ``AWS_*`` variables,
``~/.aws``, an instance role): nothing secret travels with the task, only the URL.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import DatasetError
from .objects import remote_fs

PART_BYTES = 64 << 20  # an object past this size is put in parts of this size (S3: at least 5 MiB)
READ_BYTES = 8 << 20  # what a check reads back at once


@dataclass(frozen=True)
class DirectUpload:
    """Where a task puts the files it writes: the dataset's URL (its objects are
    ``URL/REL``); ``part_bytes``: the part size of a multipart upload."""

    url: str
    part_bytes: int = PART_BYTES

    def put(self, local: Path, rel: str, sha256: str) -> int:
        """Put the file ``local`` as the object ``URL/rel``, read it back and check it
        against ``sha256`` (the writer's own digest); returns its size. A mismatch is a
        ``DatasetError`` naming the object."""
        fs, root = remote_fs(self.url, "writing", DatasetError)
        key = f"{root}/{rel}"
        try:
            with open(local, "rb") as src, fs.open(key, "wb", block_size=self.part_bytes) as dst:
                while block := src.read(self.part_bytes):
                    dst.write(block)  # the file system sends a part each time its buffer fills
            h, size = hashlib.sha256(), 0
            with fs.open(key, "rb", block_size=READ_BYTES) as got:
                while block := got.read(READ_BYTES):
                    h.update(block)
                    size += len(block)
        except Exception as e:  # noqa: BLE001 - the store's own errors (credentials, network, a missing bucket)
            raise DatasetError(
                f"{self.url}/{rel}: a worker could not put this object ({type(e).__name__}: {e}). The workers "
                f"upload the shards they write themselves: each machine running them needs the store's "
                f"credentials and endpoint (for S3: the AWS_* variables, ~/.aws or an instance role)") from None
        if h.hexdigest() != sha256:
            raise DatasetError(
                f"{self.url}/{rel}: the uploaded object's sha256 is {h.hexdigest()}, but the file written was "
                f"{sha256} ({local.stat().st_size:,} bytes; the store gave back {size:,}): the upload was "
                f"corrupted. Nothing was committed; run again")
        return size

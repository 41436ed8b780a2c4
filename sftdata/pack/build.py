"""A pack's build key (``store.build_key``): the source dataset (its path and the sha256 of
its metadata, which holds the sha256 of every file of it) and the packing options, checked
against the target before any work."""

from __future__ import annotations

from pathlib import Path

from ..storage import METADATA_FILE
from ..store.build_key import BuildCheck, base_components, check_target, read_target
from ..util.hashing import sha256_file


def pack_components(source: str, metadata_sha256: str | None, opts) -> dict:
    """A pack's build key components: the source dataset (its path and the sha256 of its
    metadata, which holds the sha256 of every file of it) and the packing options."""
    return {**base_components("packed"), "source": {"path": source, "metadata_sha256": metadata_sha256},
            "options": opts.recorded()}


def plan_pack(source: str, source_meta: Path, output_dir, opts) -> BuildCheck:
    """Is the target up to date? Only the source's metadata is hashed (a missing one: the
    reader's error comes next)."""
    def planned():
        try:
            sha = sha256_file(source_meta)
        except OSError:
            return None, f"the source dataset {source} has no readable {METADATA_FILE}"
        return pack_components(source, sha, opts), None

    return check_target(read_target(output_dir), planned, force=opts.force)

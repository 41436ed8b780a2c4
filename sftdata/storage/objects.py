"""A dataset's place in object storage: its file system and path (``remote_fs``), its
objects, their identities, and its writer's lock object.

A dataset at ``s3://bucket/sft/v3`` is the objects ``bucket/sft/v3/...``; its writer's
lock object is ``bucket/sft/.v3.sftdata-lock`` beside it (as a local target's lock file
is beside the folder), so a prefix holds nothing but the dataset. fsspec is imported
only lazily (``sftdata.util.urls``).
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from ..errors import SftDataError
from ..util.cache import cache_dir
from ..util.urls import filesystem, object_version
from .lock import LOCK_SUFFIX


def remote_fs(url: str, verb: str, error: type[SftDataError]):
    """(file system, the dataset's path in it without a trailing ``/``) for ``url``. A
    missing package is one line naming the ``cloud`` extra; a URL that names a bucket
    alone is refused (its lock object would have nowhere to go)."""
    fs, root = filesystem(url, verb, error)
    root = root.rstrip("/")
    if "/" not in root.strip("/"):
        raise error(f"{url}: give a folder inside the bucket ({url.rstrip('/')}/sft, say): a dataset is written "
                    f"under a prefix, with its lock object beside it")
    return fs, root


# a store's own "no credentials" errors (botocore, google-auth, azure-identity), by class name:
# their packages are optional, and imported only by the file system that needs them
CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                     "DefaultCredentialsError", "ClientAuthenticationError", "CredentialUnavailableError")
CREDENTIAL_HINTS = {
    "s3": "the AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY variables (or AWS_PROFILE, ~/.aws/credentials, an "
          "instance role; AWS_ENDPOINT_URL for another S3 service)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS naming a service account key file (or `gcloud auth application-default "
          "login`)",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS naming a service account key file (or `gcloud auth application-default "
           "login`)",
    "az": "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY",
    "abfs": "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY",
}


def credentials_error(url: str, e: BaseException, error: type[SftDataError]) -> SftDataError | None:
    """One line for a store's "no credentials" error: the URL and how to give them; None
    when ``e`` is another error."""
    if not any(c.__name__ in CREDENTIAL_ERRORS for c in type(e).__mro__):
        return None
    scheme = url.partition("://")[0].lower()
    how = CREDENTIAL_HINTS.get(scheme, "the store's usual credentials (its fsspec options or variables)")
    return error(f"{url}: no credentials for the object store ({type(e).__name__}: {e}); give them as for any "
                 f"{scheme} client: {how}")


UPLOADS = "uploads"  # the cache's sub-folder where datasets for URLs are built before their upload


def upload_home(url: str) -> Path:
    """The local place a dataset for ``url`` is built beside before its upload:
    ``CACHE/uploads/<sha256(URL)[:16]>/NAME`` (never itself created: its staging folders
    ``.NAME.tmp-PID-RANDOM`` and its local writer lock go beside it, as for a local target).
    CACHE is ``sftdata.util.cache.cache_dir()``, or the system's temporary folder when the cache is off."""
    home = cache_dir() or Path(tempfile.gettempdir()) / "sftdata"
    return home / UPLOADS / hashlib.sha256(url.encode()).hexdigest()[:16] / (url.rstrip("/").rpartition("/")[2] or "dataset")


def lock_key(root: str) -> str:
    """The lock object of the dataset at ``root``: ``bucket/sft/.v3.sftdata-lock``."""
    parent, _, name = root.rpartition("/")
    return f"{parent}/.{name}{LOCK_SUFFIX}"


def list_objects(fs, root: str) -> dict[str, dict]:
    """Every object under ``root/`` as {path relative to root: fsspec info}, freshly listed
    (a file system's listing cache is dropped first: another process may have written)."""
    fs.invalidate_cache(root)
    prefix = root + "/"
    try:
        found = fs.find(prefix, detail=True)
    except FileNotFoundError:
        return {}
    out = {}
    for path, info in found.items():
        path = fs._strip_protocol(path)
        if path.startswith(prefix) and info.get("type") != "directory":
            out[path[len(prefix):]] = info
    return dict(sorted(out.items()))


def identity(info: dict) -> tuple:
    """What tells one version of an object from another: its size, and the etag, checksum or
    modification time the store gives (``util.urls.object_version``, which inputs use too)."""
    return tuple(sorted((object_version(info) or {"size": info.get("size")}).items()))

"""An S3 endpoint for tests: moto's server in a thread, and an s3fs file system on it.

moto's backends are one per process, shared by every server started in it, so each use
begins from an empty moto and removes its bucket at the end."""

from __future__ import annotations

import contextlib
import logging
import os
import urllib.request
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def moto_s3(bucket: str) -> Iterator:
    """Yields an s3fs.S3FileSystem with ``bucket`` created, the AWS variables pointing at the
    server; everything is put back on exit."""
    pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = ThreadedMotoServer(port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")).close()
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir(bucket)
    try:
        yield fs
    finally:
        with contextlib.suppress(Exception):
            fs.rm(bucket, recursive=True)
        s3fs.S3FileSystem.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def objects(fs, url: str) -> dict[str, bytes]:
    """{path relative to url: bytes} of every object under url."""
    root = url.removeprefix("s3://")
    fs.invalidate_cache()
    return {p[len(root) + 1:]: fs.cat_file(p) for p in fs.find(root + "/")}

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


class CountingFS:
    """An fsspec file system that counts what is sent through it: {key: bytes} for every
    put, pipe and write (``sent``); everything else is the wrapped file system's."""

    def __init__(self, fs):
        self._fs = fs
        self.sent: dict[str, int] = {}

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def _count(self, key: str, n: int) -> None:
        key = self._fs._strip_protocol(key)
        self.sent[key] = self.sent.get(key, 0) + n

    def put(self, lpath, rpath, **kw):
        for local, remote in zip(lpath, rpath) if isinstance(lpath, list) else [(lpath, rpath)]:
            self._count(remote, os.path.getsize(local))
        return self._fs.put(lpath, rpath, **kw)

    def put_file(self, lpath, rpath, **kw):
        self._count(rpath, os.path.getsize(lpath))
        return self._fs.put_file(lpath, rpath, **kw)

    def pipe_file(self, path, value, **kw):
        self._count(path, len(value))
        return self._fs.pipe_file(path, value, **kw)

    def open(self, path, mode="rb", **kw):
        f = self._fs.open(path, mode, **kw)
        if "r" not in mode:
            write = f.write

            def counted(data):
                self._count(path, len(data))
                return write(data)
            f.write = counted
        return f


def count_coordinator(monkeypatch) -> list[CountingFS]:
    """Wrap the file system the coordinator commits through (``storage.object_commit``) in a
    ``CountingFS``; returns the list each run's wrapper is appended to. Workers and tasks
    open their own (``storage.object_upload``), uncounted."""
    from sftdata.storage import object_commit

    seen: list[CountingFS] = []
    real = object_commit.remote_fs

    def wrapped(url, verb, error):
        fs, root = real(url, verb, error)
        seen.append(CountingFS(fs))
        return seen[-1], root
    monkeypatch.setattr(object_commit, "remote_fs", wrapped)
    return seen

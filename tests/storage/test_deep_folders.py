"""Folders deeper than Python's recursion limit: every walk sftdata makes of a user's
folders (``clean``'s search, ``--overwrite``'s survey) is iterative (``manifest.walk``);
Python 3.11's ``os.walk`` recursed once per level and ended in a RecursionError."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.storage.leftovers import find_leftovers
from sftdata.storage.manifest import survey, walk

DEPTH = 1_100  # past the recursion limit (1,000), where os.walk of Python 3.11 failed
runner = CliRunner()


@pytest.fixture
def deep(tmp_path):
    """``tmp_path/root/d/d/.../d/leaf.txt``, ``DEPTH`` folders deep, made (and removed, for
    pytest's own recursive removal would fail) through folder descriptors."""
    root = tmp_path / "root"
    root.mkdir()
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    for _ in range(DEPTH):
        os.mkdir("d", dir_fd=fds[-1])
        fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
    os.close(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fds[-1]))
    yield root
    os.unlink("leaf.txt", dir_fd=fds[-1])
    for parent, child in zip(reversed(fds[:-1]), reversed(fds[1:])):
        os.close(child)
        os.rmdir("d", dir_fd=parent)
    os.close(fds[0])


def test_walk_goes_deeper_than_the_recursion_limit_in_os_walk_order(deep):
    assert DEPTH > sys.getrecursionlimit()
    seen = list(walk(deep))
    assert len(seen) == DEPTH + 1
    assert [(len(Path(p).relative_to(deep).parts), d, f) for p, d, f in seen[:2]] == [(0, ["d"], []), (1, ["d"], [])]
    assert seen[-1][1:] == ([], ["leaf.txt"])


def test_clean_searches_a_folder_deeper_than_the_recursion_limit(deep):
    assert find_leftovers(deep) == []
    r = runner.invoke(app, ["clean", str(deep)])
    assert (r.exit_code, r.output) == (0, f"nothing left behind by sftdata below {deep}\n")


def test_overwrite_survey_of_a_deep_folder_names_it_foreign(deep):
    s = survey(deep)
    assert (s.is_dataset, s.foreign) == (False, ["d/"])

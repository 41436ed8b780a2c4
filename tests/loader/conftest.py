"""The loader tests' shared fixture: one dataset of each kind the loader reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.loader import make_each_kind


@pytest.fixture(scope="module")
def each_kind(source, tmp_path_factory) -> dict[str, Path]:
    """One dataset of each kind the loader reads: {"episodes", "packed", "windows": path}."""
    return make_each_kind(source, tmp_path_factory.mktemp("d"))

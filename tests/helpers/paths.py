"""Where things are: the repository root and the test suite's data folders, the same from
any test module however deep it sits."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: sftdata/, scripts/, sample_data/, configs/, docs/
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"  # datasets written by earlier versions
CONTRACT = TESTS / "contract"  # the CLI's --help and --json snapshots

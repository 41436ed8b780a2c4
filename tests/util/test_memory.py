"""Sizes are checked before allocating: both figures and the fix, never an OOM kill."""

import pytest

from sftdata.errors import UsageError
from sftdata.util.memory import available_bytes, check_fits, human


def test_a_size_beyond_what_is_available_is_refused_with_both_figures():
    with pytest.raises(UsageError, match=r"^a batch of 4 x 1,000,000,000 tokens needs about 10\.0 GiB of memory, but "
                                         r"this machine has 8\.0 GiB available: lower batch_size$"):
        check_fits(10 << 30, "a batch of 4 x 1,000,000,000 tokens", "lower batch_size", available=8 << 30)


def test_a_size_within_the_share_passes_and_the_share_is_80_percent():
    check_fits(8 << 30, "x", "y", available=10 << 30)
    with pytest.raises(UsageError):
        check_fits((8 << 30) + 1, "x", "y", available=10 << 30)


def test_the_system_is_asked_when_no_figure_is_given():
    avail = available_bytes()
    assert avail is not None and avail > 0
    with pytest.raises(UsageError, match="needs about 8.0 EiB"):
        check_fits(1 << 63, "it", "no", available=None)


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1,023 B"), (1536, "1.5 KiB"), (3 << 30, "3.0 GiB")])
def test_human_sizes(n, text):
    assert human(n) == text

"""verify.content.rule_per_episode: the mask each episode of a chunk has alone."""

from __future__ import annotations

import numpy as np
import pytest
from test_packing import EOS, M, random_episode, token_soup

from sftdata.masking import loss_mask
from sftdata.verify.content import rule_per_episode


@pytest.mark.parametrize("seed", range(30))
def test_rule_per_episode_equals_the_rule_on_each_episode_alone(seed):
    """Well-formed episodes, damaged ones (no EOS at the end, unclosed assistant spans)
    and token soup: one call must never let one episode's tokens change another's mask."""
    rng = np.random.default_rng(seed)
    eps = []
    for _ in range(int(rng.integers(1, 25))):
        e = random_episode(rng) if rng.random() < 0.7 else np.append(token_soup(rng, int(rng.integers(1, 20))), EOS)
        if rng.random() < 0.2:
            e = e[:int(rng.integers(1, e.size + 1))]  # cut: no EOS, maybe an unclosed span
        eps.append(e)
    ids = np.concatenate(eps).astype(np.uint32)
    lengths = np.array([e.size for e in eps])
    expected = np.concatenate([loss_mask(e, M) for e in eps])
    np.testing.assert_array_equal(rule_per_episode(ids, lengths, M), expected)


def test_one_episode_without_eos_does_not_give_the_next_one_its_context():
    U, A, E = M.user, M.assistant, M.end
    first, second = np.array([U, 5, E]), np.array([A, 6, E, EOS])  # alone, the second trains nothing
    ids = np.concatenate([first, second]).astype(np.uint32)
    assert loss_mask(ids, M).sum() == 3  # what one call over both would say
    assert rule_per_episode(ids, np.array([3, 4]), M).tolist() == [0] * 7

"""The prefix probe's statistic (tests/runtime/prefix_probe.py)."""

from __future__ import annotations

import random

import pytest

from tests.runtime.prefix_probe import roc_auc


def pairs_auc(sent: list[float], unsent: list[float]) -> float:
    """The definition, pair by pair."""
    wins = sum((u > s) + 0.5 * (u == s) for s in sent for u in unsent)
    return wins / (len(sent) * len(unsent))


def test_the_auc_is_the_share_of_all_sent_unsent_pairs_in_which_the_sent_probe_was_faster_ties_half():
    assert roc_auc([1, 2], [3, 4]) == 1.0 and roc_auc([3, 4], [1, 2]) == 0.0
    assert roc_auc([1, 1], [1, 1]) == 0.5
    rng = random.Random(1)
    for _ in range(50):  # coarse values: many ties, across and within the groups
        sent = [rng.randrange(8) for _ in range(rng.randrange(1, 12))]
        unsent = [rng.randrange(8) for _ in range(rng.randrange(1, 12))]
        assert roc_auc(sent, unsent) == pytest.approx(pairs_auc(sent, unsent))

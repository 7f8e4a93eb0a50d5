"""The prefix probe's statistic and the engine process's CPU clock (tests/runtime/prefix_probe.py)."""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.runtime.prefix_probe import process_cpu_s, roc_auc


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


def test_the_process_cpu_clock_reads_a_whole_processs_cpu_time_as_the_process_reads_its_own():
    """MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) of Linux's include/linux/posix-timers.h, as glibc's
    clock_getcpuclockid builds it for another process (sysdeps/unix/sysv/linux/clock_getcpuclockid.c): read for this
    process's pid, it falls between two readings of CLOCK_PROCESS_CPUTIME_ID (time.process_time) taken around it."""
    for _ in range(3):
        before = time.process_time()
        mine = process_cpu_s(os.getpid())
        after = time.process_time()
        assert before <= mine <= after

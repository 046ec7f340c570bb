"""The fill of the kwok preemption benchmark (``bench/preempt_kwok.py``): every GPU, in waves
that any scheduler fills completely (docs/preemption.md, "End to end on kwok")."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def preempt_kwok():
    added = [str(REPO / "tests" / "kube"), str(REPO / "bench")]
    sys.path[:0] = added
    try:
        import preempt_kwok
        yield preempt_kwok
    finally:
        for p in added:
            sys.path.remove(p)


@pytest.mark.parametrize("nodes", [1, 3, 100, 1000])
def test_the_fill_takes_every_gpu_and_any_fit_in_its_order_places_every_pod(preempt_kwok, nodes):
    jobs = preempt_kwok.fill_jobs(8 * nodes, seed=1)
    assert sum(pods * each for _, pods, each, _ in jobs) == 8 * nodes
    assert {p for *_, p in jobs} <= {1, 2, 3}
    waves = [(-each, name[0] == "s") for name, _, each, _ in jobs]
    assert waves == sorted(waves)  # 8 GPUs a pod first; a size's gangs before its single pods
    free = [8] * nodes
    rng = random.Random(7)
    for _, pods, each, _ in jobs:  # a scheduler that takes any node the pod fits on
        for _ in range(pods):
            fits = [n for n, f in enumerate(free) if f >= each]
            assert fits, "a pod found no node: the fill strands GPUs"
            free[rng.choice(fits)] -= each
    assert free == [0] * nodes


def test_one_fill_priority_changes_the_priorities_only(preempt_kwok):
    three, one = preempt_kwok.fill_jobs(800, seed=1), preempt_kwok.fill_jobs(800, seed=1, lows=1)
    assert [j[:3] for j in three] == [j[:3] for j in one]
    assert {j[3] for j in one} == {1} and {j[3] for j in three} == {1, 2, 3}

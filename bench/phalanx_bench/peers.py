"""What ``bench/peers.py`` measures about gangs, computed from what a pod watch saw. Pure.

The bench creates pods (some in gangs) on kwok nodes laid out in network tiers and records,
for each pod, when its create request was sent and when a pod watch first showed it bound,
and to which node. From that alone, the same way for every scheduler, ``gang_metrics`` gives:

* time to the whole gang bound: from the first member's create to the last member's binding;
* pods/s: bound pods over the time from the first create to the last binding;
* gangs placed within their tightest possible tier: the smallest tier whose one domain holds
  all the gang's nodes, against the smallest tier with a domain big enough for the gang on
  an empty cluster (a gang of 8 one-GPU pods: one node; of 64: one 8-node leaf switch);
* gangs split across network-pods;
* GPU-seconds held by gangs that are not whole yet (bound members of an incomplete gang hold
  GPUs that do no work), the peak of it, and the longest time one gang stayed partly bound;
* gangs partly bound at the end (they hold GPUs and wait: the deadlock risk), and the GPUs
  idle at the end while some gang still waits (free, plus held by incomplete gangs).

Called by ``bench/peers.py``; tested by ``tests/unit/test_bench_peers.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TIERS = ("node", "hypernode", "leaf", "netpod", "cluster")
"""Smallest first. ``cluster``: spans network-pods."""

LABELS = {"hypernode": "phalanx.io/hypernode", "leaf": "phalanx.io/leaf-switch",
          "netpod": "phalanx.io/network-pod"}
"""The node labels of each tier above the node (docs/topology.md)."""


@dataclass(frozen=True)
class Layout:
    """``nodes`` kwok nodes of ``gpus_per_node`` GPUs, node ``i`` in HyperNode ``i // hypernode``,
    leaf switch ``i // leaf`` and network-pod ``i // netpod`` (sizes in nodes, each a multiple
    of the one below)."""

    nodes: int
    gpus_per_node: int = 8
    hypernode: int = 2
    leaf: int = 8
    netpod: int = 16

    def __post_init__(self) -> None:
        if not (0 < self.hypernode <= self.leaf <= self.netpod and self.leaf % self.hypernode == 0
                and self.netpod % self.leaf == 0 and self.nodes > 0):
            raise ValueError(f"tier sizes must nest: {self}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def name(self, i: int) -> str:
        return f"peer-{i:03d}"

    def index(self, node: str) -> int:
        return int(node.rsplit("-", 1)[1])

    def labels(self, i: int) -> dict[str, str]:
        return {LABELS["hypernode"]: f"hn-{i // self.hypernode}", LABELS["leaf"]: f"leaf-{i // self.leaf}",
                LABELS["netpod"]: f"pod-{i // self.netpod}"}

    def nodes_per(self, tier: str) -> int:
        return {"node": 1, "hypernode": self.hypernode, "leaf": self.leaf, "netpod": self.netpod,
                "cluster": self.nodes}[tier]

    def domain(self, node: str, tier: str) -> int:
        return self.index(node) // self.nodes_per(tier)

    def tightest(self, gpus: int) -> str:
        """The smallest tier with a domain that holds ``gpus`` GPUs on an empty cluster."""
        for tier in TIERS:
            if gpus <= self.nodes_per(tier) * self.gpus_per_node:
                return tier
        return "cluster"

    def tier_of(self, nodes: Sequence[str]) -> str:
        """The smallest tier one of whose domains holds every node in ``nodes``."""
        for tier in TIERS[:-1]:
            if len({self.domain(n, tier) for n in nodes}) == 1:
                return tier
        return "cluster"


@dataclass(frozen=True)
class Member:
    pod: str
    gang: str
    """Empty for a single pod."""
    size: int
    gpus: int = 1
    rdma: bool = False
    team: str = ""


def pct(samples: Sequence[float], q: float) -> float:
    """Nearest-rank ``q`` quantile; ``inf`` (not reached) sorts last; ``nan`` when empty."""
    s = sorted(samples)
    if not s:
        return math.nan
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def gang_metrics(layout: Layout, members: Sequence[Member], created: Mapping[str, float],
                 bound: Mapping[str, tuple[float, str]], end: float) -> dict:
    """The figures above for one phase. ``created[pod]`` and ``bound[pod] = (time, node)`` share
    one clock; ``end`` is when the phase stopped watching (partly bound gangs hold until then)."""
    gangs: dict[str, list[Member]] = {}
    for m in members:
        if m.gang:
            gangs.setdefault(m.gang, []).append(m)
    times: list[float] = []
    by_size: dict[int, list[float]] = {}
    whole = tight = split = partial_end = 0
    held_gpu_s = longest_partial = 0.0
    steps: list[tuple[float, int]] = []  # (time, change in GPUs held by incomplete gangs)
    waiting = False
    for ms in gangs.values():
        binds = sorted((bound[m.pod][0], m.gpus) for m in ms if m.pod in bound)
        nodes = [bound[m.pod][1] for m in ms if m.pod in bound]
        complete = len(binds) == len(ms)
        t = (binds[-1][0] - min(created[m.pod] for m in ms)) if complete else math.inf
        times.append(t)
        by_size.setdefault(len(ms), []).append(t)
        if complete:
            whole += 1
            tight += TIERS.index(layout.tier_of(nodes)) <= TIERS.index(layout.tightest(sum(m.gpus for m in ms)))
        else:
            waiting = True
        if nodes and len({layout.domain(n, "netpod") for n in nodes}) > 1:
            split += 1
        if binds and not complete:
            partial_end += 1
        # Bound members of a gang not whole yet hold their GPUs until the last member binds.
        until = binds[-1][0] if complete else end
        if binds:
            longest_partial = max(longest_partial, until - binds[0][0])
        for at, gpus in binds:
            held_gpu_s += gpus * max(0.0, until - at)
            steps += [(at, gpus), (until, -gpus)]
    peak = held = 0
    for _, change in sorted(steps, key=lambda s: (s[0], s[1])):
        held += change
        peak = max(peak, held)
    bound_gpus = sum(m.gpus for m in members if m.pod in bound)
    held_end = sum(m.gpus for ms in gangs.values() if any(m.pod not in bound for m in ms)
                   for m in ms if m.pod in bound)
    span = (max(t for t, _ in bound.values()) - min(created.values())) if bound else math.nan
    return {
        "pods": len(members), "bound": len(bound), "gangs": len(gangs), "whole": whole,
        "seconds": span, "pods_per_s": len(bound) / span if bound and span > 0 else 0.0,
        "gang_p50_s": pct(times, 0.5), "gang_p99_s": pct(times, 0.99),
        "gang_p50_by_size": {size: pct(ts, 0.5) for size, ts in sorted(by_size.items())},
        "tightest_pct": 100.0 * tight / whole if whole else math.nan,
        "split_netpods": split, "partial_at_end": partial_end,
        "held_partial_gpu_s": held_gpu_s, "held_partial_peak_gpus": peak, "longest_partial_s": longest_partial,
        "idle_gpus_while_waiting": (layout.gpus - bound_gpus + held_end) if waiting else 0,
    }

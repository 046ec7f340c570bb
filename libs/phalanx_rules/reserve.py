"""Spare capacity per domain for repairs (docs/queues.md, "Spare capacity for repairs"): a
queue's ``spec.repairReserve`` ({tier, gpus}) keeps that many free GPUs, in each domain of that
tier where the queue runs gangs, from **other queues' new work**, so that a gang of the queue
that loses members finds room for its replacements inside its domain (docs/repair.md). The
queue's own gangs and every repair attempt may use them.

* **Accounted in the quota.** The reserve is part of the queue's guarantee, never beyond it:
  each domain's is at most the queue's unused quota (quota less what it holds, subtree
  included), so a queue at or above its quota keeps nothing back (``reserves``).
* **Whole nodes.** What is kept back is nodes: in each such domain, the nodes with the most free
  GPUs first (then by name) until their free GPUs cover the reserve, or every node with a free
  GPU when they cannot (``held_back``). A node is kept for one reserve; a second reserve in the
  same domain takes other nodes. Other queues' gangs are placed as if those nodes were not
  there (the engine's ``avoid``), their preemption plans too.

Pure: placement calls it with its cache's free GPUs per node and the queues its reservations
are charged to.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from phalanx_proto.queues import GPU_UNITS
from phalanx_rules.queues import QueueTree


@dataclass(frozen=True, slots=True)
class Reserve:
    """``queue`` keeps ``gpus`` free GPUs in each domain of ``tier`` where it runs gangs."""

    queue: str
    tier: str
    gpus: int


def reserves(tree: QueueTree, held_by: Mapping[str, int]) -> list[Reserve]:
    """Every queue's reserve in force, by queue name: its ``repair_reserve`` cut to its unused
    quota in whole GPUs (``held_by``: units each queue holds, subtree included). A queue with a
    problem, or nothing left of its quota, keeps nothing back."""
    out = []
    for name in sorted(tree.specs):
        spec = tree.specs[name]
        r = spec.repair_reserve
        if r is None or spec.problem:
            continue
        gpus = min(r.gpus, max(0, spec.quota - held_by.get(name, 0)) // GPU_UNITS)
        if gpus > 0:
            out.append(Reserve(queue=name, tier=r.tier, gpus=gpus))
    return out


def held_back(rs: Collection[Reserve], queue: str, running: Mapping[str, Collection[str]], free: Mapping[str, int],
              domain: Callable[[str, str], str]) -> dict[str, str]:
    """The nodes a new gang of ``queue`` must leave alone, each with the queue it is kept for.
    ``rs``: the reserves (``reserves``); ``running``: the nodes each queue's gangs hold GPUs on
    (the queue its reservations are charged to first); ``free``: free whole GPUs per usable node
    (every node the decision may use); ``domain(node, tier)``: the node's domain at a tier. The
    reserves of ``queue`` itself keep nothing from it."""
    members: dict[tuple[str, str], list[str]] = {}
    for node in free:
        for tier in {r.tier for r in rs}:
            members.setdefault((tier, domain(node, tier)), []).append(node)
    out: dict[str, str] = {}
    for r in rs:
        if r.queue == queue:
            continue
        for d in sorted({domain(n, r.tier) for n in running.get(r.queue, ()) if n in free}):
            left = r.gpus
            for node in sorted(members.get((r.tier, d), ()), key=lambda n: (-free[n], n)):
                if left <= 0:
                    break
                if node in out or free[node] <= 0:
                    continue
                out[node] = r.queue
                left -= free[node]
    return out

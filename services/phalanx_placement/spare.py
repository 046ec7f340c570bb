"""The nodes a decision leaves alone as other queues' spare capacity for repairs (docs/queues.md,
"Spare capacity for repairs"; the rule: ``phalanx_rules.reserve``). Called by
``service.Placement._decide`` for every decision but a repair attempt's, on the decision's
cluster (the gang's own reservations excluded) and the cache's ledgers."""

from __future__ import annotations

from phalanx_engine.cluster import Cluster
from phalanx_engine.topology import TIER_NAMES, domain_of
from phalanx_proto.queues import DEFAULT_QUEUE
from phalanx_proto.state import NodeLedger
from phalanx_rules.queues import QueueTree
from phalanx_rules.reserve import held_back, reserves


def kept_from(queue: str, cluster: Cluster, ledgers: list[NodeLedger], tree: QueueTree,
              held_by: dict[str, int]) -> dict[str, str]:
    """Node → the queue whose repair reserve keeps it from a new gang of ``queue`` (empty when
    no queue keeps a reserve)."""
    rs = reserves(tree, held_by)
    if not rs or all(r.queue == queue for r in rs):
        return {}
    running: dict[str, set[str]] = {}
    for ledger in ledgers:
        for a in ledger.allocations.values():
            running.setdefault(a.queues[0] if a.queues else DEFAULT_QUEUE, set()).add(ledger.node)
    free = {name: len(st.free_whole()) for name, st in cluster.nodes.items()}
    return held_back(rs, queue, running, free, lambda node, tier: domain_of(cluster.nodes[node], tier))


def kept_detail(kept: dict[str, str], tree: QueueTree) -> str:
    """What a refusal adds when nodes were kept back: ``2 node(s) held back as spare capacity for
    queue team-a's repairs (a leaf switch each): rp-a3, rp-a4``."""
    by_queue: dict[str, list[str]] = {}
    for node, q in sorted(kept.items()):
        by_queue.setdefault(q, []).append(node)
    parts = []
    for q, nodes in sorted(by_queue.items()):
        spec = tree.get(q)
        r = spec.repair_reserve if spec is not None else None
        per = f" ({r.gpus} GPUs per {TIER_NAMES[r.tier]})" if r is not None else ""
        parts.append(f"{len(nodes)} node(s) held back as spare capacity for queue {q}'s repairs{per}: {', '.join(nodes)}")
    return "; ".join(parts)

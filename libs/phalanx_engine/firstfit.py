"""First-fit gang placement: the walking skeleton's engine, kept as a baseline.

Nodes in name order; each member takes the lowest free GPU indices of the first node that
has enough. All or nothing: if one member does not fit, nothing is placed. The topology-aware
engine replaces this in the placement service (``phalanx_engine.decide``).
"""

from __future__ import annotations

from collections import Counter

from phalanx_engine.decide import R_GPUS, node_reason
from phalanx_engine.snapshot import Decision, NoFit, Snapshot
from phalanx_proto.events import Assignment, MemberSpec


def place_first_fit(snapshot: Snapshot, members: tuple[MemberSpec, ...]) -> Decision | NoFit:
    free = {n.name: sorted(n.free_gpus()) for n in snapshot.nodes}
    assignments: list[Assignment] = []
    for m in members:
        reasons: Counter = Counter()
        for node in sorted(snapshot.nodes, key=lambda n: n.name):
            why = node_reason(node)
            if why is None and len(free[node.name]) < m.gpus:
                why = R_GPUS
            if why is not None:
                reasons[why] += 1
                continue
            take, free[node.name] = free[node.name][: m.gpus], free[node.name][m.gpus:]
            uuids = {g.index: g.uuid for g in node.topology.gpus}
            assignments.append(Assignment(pod=m.pod, node=node.name, gpus=tuple(take),
                                          gpu_uuids=tuple(uuids.get(i, "") for i in take)))
            break
        else:
            detail = f"member {m.pod} needs {m.gpus} GPU(s)" if len(members) > 1 else ""
            return NoFit(total_nodes=len(snapshot.nodes), reasons=reasons, detail=detail)
    return Decision(assignments=tuple(assignments),
                    revisions={n.name: n.revision for n in snapshot.nodes if any(a.node == n.name for a in assignments)})

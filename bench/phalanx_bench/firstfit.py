"""First-fit gang placement: the walking skeleton's engine, kept as the speed baseline.

Nodes in name order; each member takes the lowest free GPU indices of the first node that
has enough. All or nothing: if one member does not fit, nothing is placed. Free GPUs are
the engine's own view of the node (``NodeState.free_whole``: no reservation of any kind on
the GPU, as the ledger's allocations say), so first fit sees the same occupancy as the engine
it is compared with. Whole GPUs only; the placement service uses ``phalanx_engine.decide``.
"""

from __future__ import annotations

from phalanx_engine.gpu_plugins import R_GPUS, node_usable
from phalanx_engine.nodestate import NodeState
from phalanx_engine.snapshot import Decision, NoFit, Snapshot
from phalanx_engine.status import Code, MemberFailure, Status, refuse, statuses_of
from phalanx_proto.events import Assignment, MemberSpec


def free_gpus(snapshot: Snapshot) -> dict[str, tuple[int, ...]]:
    """Each usable node's free whole GPUs, ascending (built once per snapshot, like the
    engine's ``Cluster``); nodes that are not enabled, stale or GPU-less are left out."""
    return {n.name: tuple(sorted(NodeState(n).free_whole())) for n in snapshot.nodes if node_usable(n) is None}


def place_first_fit(snapshot: Snapshot, members: tuple[MemberSpec, ...],
                    free: dict[str, tuple[int, ...]] | None = None) -> Decision | NoFit:
    """Place every member (whole GPUs, ``gpus`` each) on the first node by name with enough
    free GPUs, or return why not. ``free`` is ``free_gpus(snapshot)`` when the caller has
    it already; neither it nor the snapshot is changed."""
    base = free_gpus(snapshot) if free is None else free
    left: dict[str, tuple[int, ...]] = {}
    nodes = sorted(snapshot.nodes, key=lambda n: n.name)
    assignments: list[Assignment] = []
    for m in members:
        statuses: dict[str, Status] = {}
        for node in nodes:
            why = node_usable(node)
            have = left.get(node.name, base.get(node.name, ()))
            if why is None and len(have) < m.gpus:
                why = refuse("FirstFit", Code.INSUFFICIENT_GPUS, R_GPUS, resolvable=True,
                             resource="gpus", requested=m.gpus, free=len(have))
            if why is not None:
                statuses[node.name] = why
                continue
            take, left[node.name] = have[: m.gpus], have[m.gpus:]
            uuids = {g.index: g.uuid for g in node.topology.gpus}
            assignments.append(Assignment(pod=m.pod, node=node.name, gpus=take,
                                          gpu_uuids=tuple(uuids.get(i, "") for i in take)))
            break
        else:
            detail = f"member {m.pod} needs {m.gpus} GPU(s)" if len(members) > 1 else ""
            return NoFit(total_nodes=len(snapshot.nodes), detail=detail,
                         failures=(MemberFailure(members=(m.pod,), statuses=statuses_of(statuses)),))
    return Decision(assignments=tuple(assignments))

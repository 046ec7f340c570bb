"""``phalanx sim --from-live``: the cluster as a running Phalanx holds it, read once through the
read-only ``reader`` identity (docs/whatif.md): each node's topology report (``phx-topology``)
and Kubernetes state (``phx-node-state``), its reservations (``phx-ledger``) and the queues
(``phx-queues``). The reservations become the simulated nodes' allocations: the gangs holding
them run until the end of the run (their end is not known), named as the ledger names them.

A value a bucket's rule refuses is left out, as the services leave it out (its node too, for a
topology report). Called by ``cmd_sim`` before the run; nothing here runs in virtual time.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from phalanx_engine.snapshot import NodeView, reported
from phalanx_engine.whatif import Running
from phalanx_proto.events import PodRef
from phalanx_proto.queues import QueueSpec
from phalanx_rules.queues import held_by_queue


@dataclass(frozen=True)
class Live:
    """What the simulation starts from."""

    views: tuple[NodeView, ...]
    queues: tuple[QueueSpec, ...]
    held: dict[str, int]
    """Units each queue holds by the live reservations (``Allocation.queues``)."""
    holders: dict[PodRef, Running]
    """The gang each live reservation belongs to, and its queue (the nearest on its chain)."""
    skipped: tuple[str, ...] = ()
    """Keys whose values were refused (``bucket/key: why``)."""


async def read_live(args: argparse.Namespace) -> Live:
    """Read the buckets within ``args.timeout`` seconds (``TimeoutError`` otherwise)."""
    import anyio

    from phalanx_bus import read_all
    from phalanx_cli.cmd_run import bus_auth, connect_bus
    from phalanx_proto import subjects as S

    with anyio.fail_after(args.timeout):
        bus = await connect_bus(args.nats, service="cli", budget_s=args.timeout, auth=bus_auth(args))
        try:
            topology, bad_topology = await read_all(await bus.kv(S.KV_TOPOLOGY))
            ledgers, bad_ledgers = await read_all(await bus.kv(S.KV_LEDGER), pattern="*")
            states, bad_states = await read_all(await bus.kv(S.KV_NODE_STATE))
            queues, bad_queues = await read_all(await bus.kv(S.KV_QUEUES))
        finally:
            await bus.close()
    by_node = {r.value.node: r.value for r in ledgers}
    kube = {r.key: r.value for r in states}  # keyed by the node's token (NodeKubeState names no node)
    views, holders = [], {}
    for r in sorted(topology, key=lambda r: r.value.node):
        rep = r.value
        ledger = by_node.get(rep.node)
        allocations = tuple(a.assignment for a in ledger.allocations.values()) if ledger is not None else ()
        views.append(reported(rep, allocations=allocations, kube=kube.get(S.token(rep.node))))
        for a in ledger.allocations.values() if ledger is not None else ():
            holders[a.assignment.pod] = Running(gang_id=a.gang_id, queue=a.queues[0] if a.queues else "")
    skipped = tuple(f"{bucket}/{b.key}: {b.error}" for bucket, bads in (
        (S.KV_TOPOLOGY, bad_topology), (S.KV_LEDGER, bad_ledgers), (S.KV_NODE_STATE, bad_states),
        (S.KV_QUEUES, bad_queues)) for b in bads)
    return Live(views=tuple(views), queues=tuple(r.value for r in queues), held=held_by_queue(by_node.values()),
                holders=holders, skipped=skipped)

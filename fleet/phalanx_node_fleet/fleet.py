"""node-fleet: the node agents of many simulated nodes in one process (simulator, benchmarks).

In the spirit of kubemark's hollow nodes and kwok: a cluster of thousands of simulated nodes
on one machine cannot afford two processes per node, so one process runs, for every node of a
cluster file, the same per-node classes the DaemonSet agents run — topology-discovery's
``Discovery`` and, for nodes whose GPU model has MIG, mig-manager's ``MigManager`` over a fake
NVML — sharing one bus connection and one ``ClusterPort``:

* **topology**: at start one node listing and one ``Discovery.report`` per node; then a report
  for each node whose labels or ``sim.phalanx.io/unhealthy-gpus`` annotation (its simulated GPU
  health, ``Discovery.reads``) changed, seen in the listing of every Kubernetes-state round
  below (within ``state_refresh_s`` of the change) and in a listing every ``label_refresh_s``
  (a DaemonSet agent reads its Node every beat; the fleet trades that for these listings);
* **Kubernetes state**: at start and every ``state_refresh_s`` when a pod or node changed
  (``KvCluster.revision``), one node listing and one listing of the bound pods give every
  node's ``NodeKubeState`` (``kubestate.NodeStateReporter``; a node's key of
  ``phx-node-state`` is written only when its state changed), and every ``label_refresh_s``
  each node's stored state is read back and written again if it is not the node's. A Phalanx
  pod that goes (the watch of Phalanx's pods shows it deleted or terminal) is reported at once
  for its node, from the last listing without it, as a node agent reports a departure without
  its debounce: placement frees a reservation only once the node no longer lists its pod, and a
  preemptor waits for that (docs/preemption.md). A pod seen gone is left out of every later
  report, so a listing taken before it went cannot bring it back;
* **heartbeats**: every ``heartbeat_s`` one beat per node, each under the node's own key of
  ``phx-heartbeat``, written ``concurrency`` at a time (pipelined, one connection);
* **MIG**: one durable consumer on every node's MIG subject (``phx.node.*.mig``) hands each
  command to its node's ``MigManager``; a node whose GPUs have no MIG answers a prepare with
  ``MigFailed`` and a destroy with ``MigDestroyed`` (there is nothing to destroy), as an agent
  without MIG support would; the MIG nodes are reconciled every ``reconcile_s``.

Ready once every node has been reported, has beaten once and the MIG consumer is live. A node
whose report or beat fails is retried on the next round; failures are counted in
``phalanx_topology_report_failures_total`` and logged once per round.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import anyio

from phalanx_bus import Bus, Delivery, Kv, PermanentError, consume
from phalanx_kube.port import ClusterPort, Node, NodeObjects, Pod
from phalanx_localstack.stack import ClusterFile, ClusterNode, fake_mig_spec
from phalanx_mig_manager.devices import devices_from
from phalanx_mig_manager.service import KV_MIG, MigManager
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    MigDestroyed,
    MigDestroyRequested,
    MigFailed,
    MigPrepareRequested,
    encoder,
    node_decoder,
)
from phalanx_service.config import option, required
from phalanx_telemetry import log, metrics, warn
from phalanx_topology_discovery.kubestate import NodeStateReporter
from phalanx_topology_discovery.service import Config as DiscoveryConfig
from phalanx_topology_discovery.service import Discovery, annotated_health, topology_from_file

GONE_KEPT_S = 120.0
"""How long a pod seen gone is left out of the reports: far longer than a listing takes."""

DURABLE = "mig-manager-fleet"
"""The fleet's one MIG consumer (its filter, every node's MIG commands, is in the bus table)."""


@dataclass(frozen=True)
class Config:
    """The node fleet's configuration: each field is a flag of ``phalanx run node-fleet``."""

    cluster_file: str = required("the simulated nodes (format: examples/clusters/2x8v100.yaml)")
    heartbeat_s: float = option(3.0, "seconds between heartbeats")
    label_refresh_s: float = option(30.0, "seconds between node listings; a label change is reported within this")
    state_refresh_s: float = option(2.0, "seconds between checks for pod and node changes; the nodes' Kubernetes "
                                    "states are reported again after one")
    reconcile_s: float = option(30.0, "seconds between MIG reconciliation passes of the MIG nodes")
    orphan_grace_s: float = option(60.0, "an instance owned by nothing is destroyed after this many seconds")
    concurrency: int = option(64, "node reports and heartbeats in flight at once")


class Fleet:
    """The agents of ``nodes``; ``run`` drives them."""

    def __init__(self, bus: Bus, cluster: ClusterPort, nodes: Sequence[ClusterNode], config: Config, *,
                 records: Kv, ledger: Kv) -> None:
        self.bus = bus
        self.cluster = cluster
        self.config = config
        self.agents: dict[str, Discovery] = {}
        self.states: dict[str, NodeStateReporter] = {}
        self.mig: dict[str, MigManager] = {}
        self.names: dict[str, str] = {}
        """Subject token → node name, for every node of the fleet."""
        self._read: dict[str, tuple | None] = {}
        """What each node's last report read from its Node (``Discovery.reads``)."""
        self._listed: dict[str, Node] = {}
        """The nodes as the last state round listed them."""
        self._pods: dict[str, tuple[Pod, ...]] = {}
        """Each node's bound pods as the last state round listed them."""
        self.gone: dict[str, float] = {}
        """Uid → when the watch showed that Phalanx pod gone (deleted or terminal): left out of
        every report from then on (a uid never comes back), forgotten after ``GONE_KEPT_S``."""
        for n in nodes:
            topo = topology_from_file(n.topology_file, n.name, gpu_model=n.gpu_model,
                                      gpu_memory_mib=n.gpu_memory_mib, mig_enabled=n.mig_enabled)
            self.agents[n.name] = Discovery(bus, cluster, DiscoveryConfig(node=n.name, heartbeat_s=config.heartbeat_s,
                                                                    advertise=n.advertise or "auto"),
                                            lambda topo=topo: topo, health=annotated_health)
            self.states[n.name] = NodeStateReporter(bus, n.name)
            self.names[S.token(n.name)] = n.name
            spec = fake_mig_spec(n)
            if spec is not None:
                self.mig[S.token(n.name)] = MigManager(bus, n.name, devices_from(f"fake:{spec}", n.name), records, ledger,
                                                       orphan_grace_s=config.orphan_grace_s)

    # -- topology and heartbeats --------------------------------------------------------------
    async def report(self, *, changed_only: bool, listed: dict[str, Node] | None = None) -> int:
        """Report every node (or those whose labels or simulated GPU health changed) from one
        node listing (``listed``, else one made here); returns how many were reported."""
        if listed is None:
            listed = {n.name: n for n in await self.cluster.list_nodes()}
        todo, reads = [], {}
        for name, agent in self.agents.items():
            node: Node | None = listed.get(name)
            reads[name] = agent.reads(node)
            if not changed_only or name not in self._read or self._read[name] != reads[name]:
                todo.append((name, node))
        failed = await self._each(todo, lambda item: self.agents[item[0]].report(item[1]), "report")
        for name, _ in todo:
            if name not in failed:
                self._read[name] = reads[name]
        return len(todo) - len(failed)

    async def report_states(self, listed: dict[str, Node] | None = None) -> int:
        """Every node's Kubernetes state from one node listing (``listed``, else one made here)
        and one pod listing; returns how many nodes' stored states changed."""
        if listed is None:
            listed = {n.name: n for n in await self.cluster.list_nodes()}
        pods: dict[str, list[Pod]] = {}
        for p in await self.cluster.list_bound_pods():
            pods.setdefault(p.node_name, []).append(p)
        self._listed, self._pods = listed, {name: tuple(ps) for name, ps in pods.items()}
        cutoff = time.monotonic() - GONE_KEPT_S
        self.gone = {uid: at for uid, at in self.gone.items() if at > cutoff}
        changed: list[str] = []

        async def one(name: str) -> None:
            if await self.states[name].observe(self._objects(name)):
                changed.append(name)

        await self._each(list(self.states), one, "node state")
        return len(changed)

    def _objects(self, name: str) -> NodeObjects:
        """Node ``name`` and its pods as last listed, without the pods seen gone since."""
        return NodeObjects(node=self._listed.get(name),
                           pods=tuple(p for p in self._pods.get(name, ()) if p.uid not in self.gone))

    async def departures(self) -> None:
        """Follow Phalanx's pods; when one bound to a node of the fleet is deleted or turns
        terminal, report that node at once (``NodeStateReporter.departed``'s rule for a node
        agent)."""
        while True:
            try:
                async for ev in self.cluster.watch_pods():
                    if ev is None or not (ev.type == "DELETED" or ev.pod.terminal) or not ev.pod.uid:
                        continue
                    self.gone[ev.pod.uid] = time.monotonic()
                    name = ev.pod.node_name
                    if name in self.states and name in self._listed:
                        objs = self._objects(name)
                        reporter = self.states[name]
                        if reporter.departed(objs):
                            try:
                                await reporter.observe(objs)
                            except Exception as e:  # noqa: BLE001 - the next round reports it
                                warn("fleet departure report failed", node=name, error=repr(e)[:300])
            except Exception as e:  # noqa: BLE001 - the watch broke: follow again
                warn("fleet pod watch failed", error=repr(e)[:300])
                await anyio.sleep(1.0)

    async def reassert_states(self) -> int:
        """Each node's stored state read back, written again where it is not the node's."""
        written: list[str] = []

        async def one(name: str) -> None:
            if await self.states[name].reassert():
                written.append(name)

        await self._each(list(self.states), one, "node state re-assert")
        return len(written)

    async def state_loop(self) -> None:
        """Report the nodes' states again whenever the simulated cluster changed, and the
        topology of the nodes whose labels or GPU health changed, from the same node listing."""
        seen = None
        while True:
            await anyio.sleep(self.config.state_refresh_s)
            try:
                revision = await self.cluster.revision() if hasattr(self.cluster, "revision") else None
                if revision is None or revision != seen:
                    seen = revision
                    listed = {n.name: n for n in await self.cluster.list_nodes()}
                    await self.report_states(listed)
                    if (reported := await self.report(changed_only=True, listed=listed)):
                        log("fleet reported node changes", nodes=reported)
            except Exception as e:  # noqa: BLE001 - the listing failed: next period retries
                metrics.HEARTBEAT_FAILURES.inc()
                warn("fleet node state listing failed", error=repr(e)[:300])

    async def beat(self) -> int:
        """One heartbeat per node, each under its own key; returns how many were stored."""
        kv = await self.bus.kv(S.KV_HEARTBEAT)

        async def one(name: str) -> None:
            await kv.put(S.token(name), encoder.encode(self.agents[name].heartbeat()))

        return len(self.agents) - len(await self._each(list(self.agents), one, "heartbeat"))

    async def _each(self, items: Iterable, fn: Callable[..., Awaitable[object]], what: str) -> set:
        """``fn(item)`` for every item, ``concurrency`` at a time; the items whose call failed."""
        limiter = anyio.CapacityLimiter(self.config.concurrency)
        failed: dict = {}

        async def guarded(item) -> None:
            async with limiter:
                try:
                    await fn(item)
                except Exception as e:  # noqa: BLE001 - this node is retried next round
                    failed[item[0] if isinstance(item, tuple) else item] = e
                    metrics.HEARTBEAT_FAILURES.inc()

        async with anyio.create_task_group() as tg:
            for item in items:
                tg.start_soon(guarded, item)
        if failed:
            first, error = next(iter(failed.items()))
            warn(f"fleet {what} failed for some nodes", nodes=len(failed), first=first, error=repr(error)[:300])
        return set(failed)

    async def beat_loop(self) -> None:
        while True:
            await anyio.sleep(self.config.heartbeat_s)
            await self.beat()

    async def label_loop(self) -> None:
        while True:
            await anyio.sleep(self.config.label_refresh_s)
            try:
                if (reported := await self.report(changed_only=True)):
                    log("fleet reported label changes", nodes=reported)
                if (states := await self.reassert_states()):
                    log("fleet wrote node states again", nodes=states)
            except Exception as e:  # noqa: BLE001 - the listing failed: next period retries
                metrics.HEARTBEAT_FAILURES.inc()
                warn("fleet node listing failed", error=repr(e)[:300])

    # -- MIG -------------------------------------------------------------------------------------
    async def on_mig(self, event, delivery: Delivery) -> None:
        """Hand a MIG command to the node its subject names."""
        token = S.node_of_mig_subject(delivery.subject)
        manager = self.mig.get(token)
        if manager is not None:
            await manager.on_command(event, delivery)
            return
        node = self.names.get(token)
        if node is None:
            raise PermanentError(f"{delivery.subject}: node {token!r} is not served by this fleet")
        match event:
            case MigPrepareRequested():
                reply = MigFailed(node=node, gang_id=event.gang_id, attempt=event.attempt, pod=event.pod,
                                  reason=f"node {node} has no MIG-capable GPU")
            case MigDestroyRequested():
                reply = MigDestroyed(node=node, gang_id=event.gang_id, attempt=event.attempt, pod=event.pod)
            case _:
                warn("unexpected event on mig subject", node=node, kind=type(event).__name__)
                return
        await self.bus.publish(S.node_reply_subject(node), reply)

    async def reconcile_loop(self) -> None:
        while True:
            await anyio.sleep(self.config.reconcile_s)
            for manager in list(self.mig.values()):
                try:
                    await manager.reconcile()
                except Exception as e:  # noqa: BLE001 - the next pass retries
                    warn("mig reconcile failed", node=manager.node, error=repr(e)[:300])


async def run(bus: Bus, cluster: ClusterPort, config: Config, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run the fleet of ``config.cluster_file``'s nodes until cancelled (overview in the module
    docstring)."""
    started = time.monotonic()
    nodes = ClusterFile.load(config.cluster_file).nodes
    fleet = Fleet(bus, cluster, nodes, config, records=await bus.kv(KV_MIG), ledger=await bus.kv(S.KV_LEDGER))
    for manager in fleet.mig.values():
        await manager.reconcile()
    reported = await fleet.report(changed_only=False)
    await fleet.report_states()
    beats = await fleet.beat()
    async with anyio.create_task_group() as tg:
        tg.start_soon(fleet.beat_loop)
        tg.start_soon(fleet.label_loop)
        tg.start_soon(fleet.state_loop)
        tg.start_soon(fleet.departures)
        if fleet.mig:
            tg.start_soon(fleet.reconcile_loop)
        await tg.start(lambda task_status: consume(
            bus, stream=S.CONSUMER[DURABLE].stream, durable=DURABLE, filter_subject=S.CONSUMER[DURABLE].filter,
            decoder=node_decoder, handler=fleet.on_mig, task_status=task_status))
        log("fleet ready", nodes=len(fleet.agents), mig_nodes=len(fleet.mig), reported=reported, beats=beats,
            s=round(time.monotonic() - started, 2))
        task_status.started(fleet)

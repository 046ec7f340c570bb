"""topology-discovery: the node agent that keeps the cluster's picture of one node fresh.

It reads the node's topology (NVML on a GPU node, or a ``nvidia-smi topo -m`` / YAML file in
the simulator and tests), reads its Node's labels for network tiers and enablement, and

* puts the report in KV ``phx-topology`` and publishes ``NodeTopologyReported`` whenever the
  report changes (new generation, new labels);
* puts a ``NodeHeartbeat`` in KV ``phx-heartbeat`` every ``heartbeat_s``; placement treats a
  node whose beat is older than its bound as unavailable;
* watches its Node and the pods bound to it and puts the node's Kubernetes state
  (``NodeKubeState``: allocatable, taints, labels, cordon, Ready, what the pods Phalanx did not
  place request and bind) in KV ``phx-node-state`` when it changes (``kubestate``);
* reports the node's GPU resources to the kubelet (R11: "resources reported"): on a real node
  by running the device plugin (``phalanx_deviceplugin``, docs/delivery.md) while the node is
  enabled, so the kubelet advertises them and hands each pod exactly the devices Phalanx chose;
  on nodes without a kubelet (the simulator, kwok) by patching them into the Node status
  (``--advertise node-status``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import anyio
import msgspec

from phalanx_bus import Bus
from phalanx_kube.port import ClusterPort, Node
from phalanx_proto import subjects as S
from phalanx_proto.events import NodeHeartbeat, NodeTopologyReported, encoder
from phalanx_proto.topology import NodeTopology
from phalanx_telemetry import log, metrics, warn
from phalanx_topology.files import topology_from_file  # noqa: F401 - re-exported (phalanx sim reads it there)
from phalanx_topology.tiers import ACK_LABEL, ENABLE_LABEL, enabled_by_labels, tiers_from_labels  # noqa: F401
from phalanx_topology_discovery.kubestate import DEBOUNCE_S, REASSERT_S, NodeStateReporter


@dataclass(frozen=True)
class Config:
    node: str
    heartbeat_s: float = 3.0
    node_state: bool = True
    """Report the node's Kubernetes state to ``phx-node-state`` (``kubestate``)."""
    node_state_debounce_s: float = DEBOUNCE_S
    node_state_reassert_s: float = REASSERT_S


def extended_resources(topo: NodeTopology) -> dict[str, str]:
    """What the node advertises: whole GPUs, 100 core-% per GPU, GPU memory in GiB."""
    n = len(topo.gpus)
    if n == 0:
        return {}
    whole = "nvidia.com/gpu" if all(g.vendor == "nvidia" for g in topo.gpus) else "aliyun.com/gpu"
    mem_gib = sum(g.memory_mib for g in topo.gpus) // 1024
    res = {whole: str(n), "aliyun.com/gpu-core": str(100 * n)}
    if mem_gib:
        res["aliyun.com/gpu-memory"] = str(mem_gib)
    return res


class ResourceAgent(Protocol):
    """Serves the node's resources to the kubelet (the device plugin)."""

    async def ensure(self, topo: NodeTopology, enabled: bool) -> None: ...


class Discovery:
    def __init__(self, bus: Bus, cluster: ClusterPort, config: Config, read: Callable[[], NodeTopology],
                 agent: ResourceAgent | None = None) -> None:
        self.bus = bus
        self.cluster = cluster
        self.config = config
        self.read = read
        self.agent = agent
        self._last: NodeTopologyReported | None = None
        self._advertised: dict[str, str] | None = None

    async def report_once(self) -> None:
        """One beat of the per-node agent: read the Node, report what changed, put a heartbeat."""
        node = await self.cluster.get_node(self.config.node)
        await self.report(node)
        await (await self.bus.kv(S.KV_HEARTBEAT)).put(S.token(self.config.node), encoder.encode(self.heartbeat()))

    async def report(self, node: Node | None) -> None:
        """Store and publish the topology report when it differs from the stored one, and
        advertise the node's extended resources when they changed. ``node`` is this agent's
        Node as read from the cluster (``None`` when it does not exist)."""
        topo = self.read()
        labels = node.labels if node else {}
        report = NodeTopologyReported(
            node=self.config.node, topology=topo, tiers=tiers_from_labels(self.config.node, labels),
            enabled=enabled_by_labels(labels), device_plugin=self.agent is not None)
        topo_kv = await self.bus.kv(S.KV_TOPOLOGY)
        current = await topo_kv.get(S.token(self.config.node))
        if current is None or current.value != encoder.encode(report):
            if self._last is not None and self._last.topology != topo:
                # Hardware changed under a running agent: bump the generation.
                topo = msgspec.structs.replace(topo, generation=self._last.topology.generation + 1)
                report = msgspec.structs.replace(report, topology=topo)
            await topo_kv.put(S.token(self.config.node), encoder.encode(report))
            await self.bus.publish(S.topology_subject(self.config.node), report,
                                   msg_id=f"{report.key()}:{time.time():.3f}")
            metrics.TOPOLOGY_REPORTS.inc()
            log("topology reported", node=self.config.node, gpus=len(topo.gpus), nics=len(topo.nics),
                enabled=report.enabled, hypernode=report.tiers.hypernode, generation=topo.generation)
        self._last = report
        if self.agent is not None:
            await self.agent.ensure(topo, report.enabled)
        elif node is not None:
            res = extended_resources(topo)
            if res and res != self._advertised:
                await self.cluster.patch_node_capacity(self.config.node, res)
                self._advertised = res
                log("resources advertised", node=self.config.node, **{k.replace("/", "_"): v for k, v in res.items()})

    def heartbeat(self) -> NodeHeartbeat:
        """The beat to store under this node's key in ``phx-heartbeat`` (after a ``report``)."""
        generation = self._last.topology.generation if self._last is not None else 0
        return NodeHeartbeat(node=self.config.node, generation=generation, at=time.time())

    async def loop(self) -> None:
        while True:
            await anyio.sleep(self.config.heartbeat_s)
            try:
                await self.report_once()
            except Exception as e:  # noqa: BLE001 - next beat retries
                metrics.HEARTBEAT_FAILURES.inc()
                warn("report failed", node=self.config.node, error=repr(e))


async def run(bus: Bus, cluster: ClusterPort, config: Config, read: Callable[[], NodeTopology], *,
              agent: Callable[[anyio.abc.TaskGroup], ResourceAgent] | None = None,
              task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run topology-discovery until cancelled; ready once the first topology report and the
    first Kubernetes-state report are stored. ``agent``
    builds the device plugin agent in the service's task group; without it the resources are
    patched into the Node status."""
    async with anyio.create_task_group() as tg:
        discovery = Discovery(bus, cluster, config, read, agent(tg) if agent else None)
        await discovery.report_once()
        tg.start_soon(discovery.loop)
        if config.node_state:
            await tg.start(functools.partial(NodeStateReporter(bus, config.node).follow, cluster,
                                             debounce_s=config.node_state_debounce_s,
                                             reassert_s=config.node_state_reassert_s))
        task_status.started()

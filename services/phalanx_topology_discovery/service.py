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
  (``--advertise node-status``); not at all on a node whose GPUs a DRA driver publishes
  (``--advertise none``: its pods get GPUs through ResourceClaims, docs/dra.md).
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
from phalanx_proto.kubeapi import ACK_LABEL, ALIYUN_GPU, ENABLE_LABEL, GPU_CORE, GPU_MEMORY, NVIDIA_GPU  # noqa: F401
from phalanx_proto.topology import NodeTopology
from phalanx_service.config import option, required
from phalanx_telemetry import log, metrics, warn
from phalanx_topology.files import topology_from_file  # noqa: F401 - re-exported (phalanx sim reads it there)
from phalanx_topology.tiers import enabled_by_labels, tiers_from_labels  # noqa: F401
from phalanx_topology_discovery.kubestate import DEBOUNCE_S, REASSERT_S, NodeStateReporter

DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
STATE_DIR = "/var/lib/phalanx/deviceplugin"
PLUGIN = "device plugin (docs/delivery.md)"
"""The ``--help`` group of the device plugin's flags."""


@dataclass(frozen=True)
class Config:
    """topology-discovery's configuration: each field but ``node_state`` is a flag of ``phalanx
    run topology-discovery`` (``phalanx_service.config``)."""

    node: str = required("this node's name", env="NODE_NAME")
    topology_file: str | None = option(None, "read the topology from an 'nvidia-smi topo -m' or Phalanx YAML file "
                                       "instead of NVML", env="PHALANX_TOPOLOGY_FILE")
    gpu_model: str = option("", "GPU model for a topology file that does not name it (nvidia-smi topo -m prints "
                            "no model)")
    gpu_memory_mib: int = option(0, "GPU memory (MiB) for a topology file without it")
    mig_enabled: bool = option(False, "mark the file's MIG-capable GPUs as in MIG mode (NVML reports the real mode)")
    heartbeat_s: float = option(10.0, "seconds between heartbeats (placement's --heartbeat-stale-s is 4x this by "
                                "default, as the kubelet's lease renewal and node-monitor grace period)")
    node_state: bool = True
    """Report the node's Kubernetes state to ``phx-node-state`` (``kubestate``)."""
    node_state_debounce_s: float = option(DEBOUNCE_S, "at most one report of the node's Kubernetes state per this "
                                          "many seconds")
    node_state_reassert_s: float = option(REASSERT_S, "read the stored Kubernetes state back this often and write "
                                          "it again if it is not this node's (deleted, lost)")
    advertise: str = option("auto", "how the node's GPU resources reach the kubelet: 'device-plugin' serves them "
                            "(a real node; the DaemonSet sets this), 'node-status' patches them into the Node status "
                            "(the simulator and kwok, which have no kubelet), 'none' advertises nothing (the node's "
                            "GPUs are a DRA driver's: pods get them through ResourceClaims, and nvidia.com/gpu through "
                            "the DeviceClass that names it, KEP-5004); 'auto' = device-plugin when the "
                            "kubelet's registration socket exists", env="PHALANX_ADVERTISE",
                            choices=("auto", "device-plugin", "node-status", "none"), group=PLUGIN)
    device_plugin_dir: str = option(DEVICE_PLUGIN_DIR, "the kubelet's device-plugin directory",
                                    env="PHALANX_DEVICE_PLUGIN_DIR", group=PLUGIN)
    pod_resources_socket: str = option(POD_RESOURCES_SOCKET, "the kubelet's PodResources socket",
                                       env="PHALANX_POD_RESOURCES_SOCKET", group=PLUGIN)
    state_dir: str = option(STATE_DIR, "where the plugin keeps what it served, across restarts",
                            env="PHALANX_STATE_DIR", group=PLUGIN)
    fence_namespace: str = option("phalanx-system", "namespace of binder's per-node fence leases",
                                  env="POD_NAMESPACE", group=PLUGIN)
    cdi: bool = option(True, "name GPUs in NVIDIA_VISIBLE_DEVICES instead of CDI (only where the node has no "
                       "CDI; see docs/delivery.md for why env-var delivery is not access control)", flag="--no-cdi",
                       group=PLUGIN)
    sysfs_root: str = option("/", "the directory holding the host's sys/ (RDMA device nodes of the chosen NICs are "
                             "read from <root>/sys/class/infiniband)", env="PHALANX_SYSFS_ROOT", group=PLUGIN)
    mps_pipe_dir: str = option("", "the node's MPS control daemon pipe directory, if it runs one", group=PLUGIN)
    mps_active_thread_pct: int = option(0, "the MPS daemon's default active thread percentage (what it enforces "
                                        "on every client)", group=PLUGIN)
    mps_pinned_mem_mib: int = option(0, "the MPS daemon's default pinned device memory limit in MiB", group=PLUGIN)


def extended_resources(topo: NodeTopology) -> dict[str, str]:
    """What the node advertises: whole GPUs, 100 core-% per GPU, GPU memory in GiB."""
    n = len(topo.gpus)
    if n == 0:
        return {}
    whole = NVIDIA_GPU if all(g.vendor == "nvidia" for g in topo.gpus) else ALIYUN_GPU
    mem_gib = sum(g.memory_mib for g in topo.gpus) // 1024
    res = {whole: str(n), GPU_CORE: str(100 * n)}
    if mem_gib:
        res[GPU_MEMORY] = str(mem_gib)
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
        elif node is not None and self.config.advertise != "none":
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


def reader(config: Config) -> Callable[[], NodeTopology]:
    """Where the topology comes from: ``config.topology_file`` (read once), else NVML."""
    if config.topology_file:
        topo = topology_from_file(config.topology_file, config.node, gpu_model=config.gpu_model,
                                  gpu_memory_mib=config.gpu_memory_mib, mig_enabled=config.mig_enabled)
        return lambda: topo
    from phalanx_nvml import NvmlDiscovery

    nvml = NvmlDiscovery()
    return lambda: nvml.discover(config.node)


def plugin_agent(config: Config, cluster: ClusterPort) -> Callable[[anyio.abc.TaskGroup], ResourceAgent] | None:
    """The device plugin agent's factory, or None when the resources go into the Node status
    (``config.advertise``)."""
    from phalanx_deviceplugin import agent as A
    from phalanx_deviceplugin import delivery as dv

    mode = config.advertise
    if mode == "auto":
        mode = "device-plugin" if A.kubelet_present(config.device_plugin_dir) else "node-status"
    if mode in ("node-status", "none"):
        return None
    mps = (dv.Mps(config.mps_pipe_dir, config.mps_active_thread_pct, config.mps_pinned_mem_mib)
           if config.mps_pipe_dir else None)
    plugin = A.AgentConfig(node=config.node, socket_dir=config.device_plugin_dir,
                           pod_resources_socket=config.pod_resources_socket, state_dir=config.state_dir,
                           fence_namespace=config.fence_namespace,
                           delivery=dv.Delivery(cdi=config.cdi, mps=mps, sysfs_root=config.sysfs_root))
    unhealthy = lambda uuids: frozenset()  # noqa: E731 - a topology file has no NVML to ask
    if not config.topology_file:
        from phalanx_nvml.health import NvmlHealth

        unhealthy = NvmlHealth().unhealthy
    return lambda tg: A.PluginAgent(tg, cluster, plugin, unhealthy)


async def run(bus: Bus, cluster: ClusterPort, config: Config, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run topology-discovery until cancelled; ready once the first topology report and the
    first Kubernetes-state report are stored. The topology comes from ``reader(config)``; the
    device plugin agent (``plugin_agent``) runs in the service's task group, or, without one,
    the resources are patched into the Node status."""
    read, agent = reader(config), plugin_agent(config, cluster)
    async with anyio.create_task_group() as tg:
        discovery = Discovery(bus, cluster, config, read, agent(tg) if agent else None)
        await discovery.report_once()
        tg.start_soon(discovery.loop)
        if config.node_state:
            await tg.start(functools.partial(NodeStateReporter(bus, config.node).follow, cluster,
                                             debounce_s=config.node_state_debounce_s,
                                             reassert_s=config.node_state_reassert_s))
        task_status.started()

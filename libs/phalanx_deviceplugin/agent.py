"""The device plugin as the node agent runs it (topology-discovery, ``--advertise device-plugin``).

``PluginAgent.ensure(topology, enabled)`` is called on every report: it serves the kubelet while
the node is enabled (and stops when it is not, so the resources leave the node), swaps in a new
device table when the topology changes, and records each served pod's isolation level on the
pod (annotation ``phalanx.io/isolation`` and an event), off the admission path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from phalanx_deviceplugin import delivery as dv
from phalanx_deviceplugin.devices import DeviceTable
from phalanx_deviceplugin.plugin import Admitting, Plugin
from phalanx_deviceplugin.served import ServedStore
from phalanx_deviceplugin.server import Devices, KubeletSession, PodResourcesClient
from phalanx_kube.port import ClusterPort, PodGone
from phalanx_proto.kubeapi import ISOLATION_ANNOTATION
from phalanx_proto.topology import NodeTopology
from phalanx_telemetry import log, warn

DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
STATE_DIR = "/var/lib/phalanx/deviceplugin"


@dataclass(frozen=True)
class AgentConfig:
    node: str
    socket_dir: str = DEVICE_PLUGIN_DIR
    pod_resources_socket: str = POD_RESOURCES_SOCKET
    state_dir: str = STATE_DIR
    fence_namespace: str = "phalanx-system"
    delivery: dv.Delivery = dv.Delivery()
    health_s: float = 5.0
    """How often the session asks which GPUs are unhealthy (``KubeletSession.health_s``)."""


def kubelet_present(socket_dir: str) -> bool:
    """A kubelet serves device plugins here (its registration socket exists)."""
    return (Path(socket_dir) / "kubelet.sock").exists()


class PluginAgent:
    """Runs one ``KubeletSession`` in ``tg`` while the node is enabled."""

    def __init__(self, tg: anyio.abc.TaskGroup, cluster: ClusterPort, config: AgentConfig,
                 unhealthy_gpus: Callable[[list[str]], frozenset[str]] = lambda uuids: frozenset()) -> None:
        self.tg = tg
        self.cluster = cluster
        self.config = config
        self.unhealthy_gpus = unhealthy_gpus
        self.session: KubeletSession | None = None
        self._scope: anyio.CancelScope | None = None
        self._done: anyio.Event | None = None
        self._recorded: set[str] = set()
        self._send, self._receive = anyio.create_memory_object_stream[Admitting](256)
        self._recorder_started = False

    def _unhealthy(self, table: DeviceTable) -> Callable[[], frozenset[str]]:
        uuids = [g.uuid for g in table.topology.gpus if g.uuid]
        return lambda: frozenset(f"gpu:{u}" for u in self.unhealthy_gpus(uuids))

    async def ensure(self, topo: NodeTopology, enabled: bool) -> None:
        """Serve (or stop serving) the kubelet for this topology; idempotent."""
        if not enabled or not topo.gpus:
            await self.stop()
            return
        table = DeviceTable(topo)
        if self.session is not None:
            old = self.session.devices.table
            if old.topology == topo:
                return
            if old.resources == table.resources:
                await self.session.retable(table, self._unhealthy(table))
                log("device table updated", node=self.config.node, generation=topo.generation)
                return
            await self.stop()
        await self._start(table)

    async def _start(self, table: DeviceTable) -> None:
        c = self.config
        if not self._recorder_started:
            self.tg.start_soon(self._record_isolation)
            self._recorder_started = True
        plugin = Plugin(node=c.node, table=table, cluster=self.cluster,
                        pod_resources=PodResourcesClient(c.pod_resources_socket),
                        served=ServedStore(Path(c.state_dir) / "served.json"), delivery=c.delivery,
                        fence_namespace=c.fence_namespace, on_served=self._served)
        self.session = KubeletSession(socket_dir=c.socket_dir, plugin=plugin, devices=Devices(table),
                                      unhealthy=self._unhealthy(table), health_s=c.health_s)
        self._done = anyio.Event()
        self._scope = await self.tg.start(self._run, self.session, self._done)

    async def _run(self, session: KubeletSession, done: anyio.Event, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        try:
            with anyio.CancelScope() as scope:
                task_status.started(scope)
                await session.run()
        finally:
            done.set()

    async def stop(self) -> None:
        """Stop serving; returns once the plugin's sockets are closed."""
        if self._scope is not None:
            self._scope.cancel()
            with anyio.fail_after(30, shield=True):
                await self._done.wait()
            self._scope = self._done = None
            self.session = None
            log("device plugin stopped", node=self.config.node)

    async def _served(self, adm: Admitting) -> None:
        if adm.pod.uid not in self._recorded:
            self._recorded.add(adm.pod.uid)
            try:
                self._send.send_nowait(adm)
            except anyio.WouldBlock:
                warn("isolation record dropped (queue full)", pod=f"{adm.pod.namespace}/{adm.pod.name}")

    async def _record_isolation(self) -> None:
        async for adm in self._receive:
            level, why = dv.isolation(adm.assignment, self.config.delivery)
            ref = adm.pod.ref
            try:
                await self.cluster.annotate_pod(ref, {ISOLATION_ANNOTATION: level})
                await self.cluster.record_event(ref, reason="GpuIsolation", message=f"isolation {level}: {why}",
                                                type="Normal" if level != "advisory" else "Warning")
            except PodGone:
                continue
            except Exception as e:  # noqa: BLE001 - best effort: the container already has its devices
                warn("isolation record failed", pod=str(ref), error=repr(e)[:200])

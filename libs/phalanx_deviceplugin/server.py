"""The plugin on the kubelet's sockets: gRPC servers (one per resource), registration, the
re-registration when the kubelet restarts, ``ListAndWatch`` with health, and the PodResources
client. ``grpc`` is imported here and in the generated stubs only.

Sockets: the plugin serves ``<device-plugin dir>/phalanx-<resource>.sock`` and registers at
``<device-plugin dir>/kubelet.sock`` (``/var/lib/kubelet/device-plugins`` on a node). The kubelet
wipes that directory's sockets when it starts, then creates a new ``kubelet.sock``: the watch
loop notices the new socket (another inode) or its own missing socket, and serves and registers
every resource again.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import grpc

from phalanx_deviceplugin import delivery as dv
from phalanx_deviceplugin.devices import DeviceTable
from phalanx_deviceplugin.kubelet.deviceplugin.v1beta1 import api_pb2 as dp
from phalanx_deviceplugin.kubelet.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from phalanx_deviceplugin.kubelet.podresources.v1 import api_pb2 as pr
from phalanx_deviceplugin.kubelet.podresources.v1 import api_pb2_grpc as pr_grpc
from phalanx_deviceplugin.plugin import KubeletPod, Plugin, Refused
from phalanx_telemetry import log, warn

API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
RPC_TIMEOUT_S = 10.0


def socket_name(resource: str) -> str:
    return "phalanx-" + resource.replace("/", "_").replace(".", "-") + ".sock"


def _response(e: dv.Edits) -> dp.ContainerAllocateResponse:
    return dp.ContainerAllocateResponse(
        envs=e.envs, cdi_devices=[dp.CDIDevice(name=n) for n in e.cdi_devices],
        devices=[dp.DeviceSpec(container_path=c, host_path=h, permissions=p) for c, h, p in e.devices],
        mounts=[dp.Mount(container_path=c, host_path=h, read_only=ro) for c, h, ro in e.mounts])


class Devices:
    """The advertised devices with their health; ``changed`` wakes every ``ListAndWatch``."""

    def __init__(self, table: DeviceTable) -> None:
        self.table = table
        self.unhealthy: frozenset[str] = frozenset()
        self.version = 0
        self.changed = asyncio.Condition()
        self.watchers: dict[str, int] = {}
        """Open ``ListAndWatch`` streams per resource: the kubelet keeps one per registered plugin."""

    async def update(self, *, table: DeviceTable | None = None, unhealthy: frozenset[str] | None = None) -> None:
        async with self.changed:
            if table is not None:
                self.table = table
            if unhealthy is not None:
                self.unhealthy = unhealthy
            self.version += 1
            self.changed.notify_all()

    def listing(self, resource: str) -> dp.ListAndWatchResponse:
        return dp.ListAndWatchResponse(devices=[
            dp.Device(ID=d.id, health=UNHEALTHY if d.target in self.unhealthy else HEALTHY,
                      topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=d.numa)]) if d.numa >= 0 else None)
            for d in self.table.devices.get(resource, ())])


class ResourceServicer(dp_grpc.DevicePluginServicer):
    """``DevicePlugin`` for one resource name."""

    def __init__(self, resource: str, plugin: Plugin, devices: Devices) -> None:
        self.resource = resource
        self.plugin = plugin
        self.devices = devices

    async def GetDevicePluginOptions(self, request, context):  # noqa: N802 - gRPC method names
        return dp.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)

    async def ListAndWatch(self, request, context):  # noqa: N802
        seen = -1
        watchers = self.devices.watchers
        watchers[self.resource] = watchers.get(self.resource, 0) + 1
        try:
            while True:
                async with self.devices.changed:
                    await self.devices.changed.wait_for(lambda last=seen: self.devices.version != last)
                    seen = self.devices.version
                    listing = self.devices.listing(self.resource)
                yield listing
        finally:
            watchers[self.resource] -= 1

    async def _refusing(self, context, call):
        try:
            return await call()
        except Refused as e:
            warn("device request refused", resource=self.resource, reason=str(e)[:300])
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"phalanx: {e}")

    async def GetPreferredAllocation(self, request, context):  # noqa: N802
        async def call():
            out = []
            for r in request.container_requests:
                ids = await self.plugin.preferred(self.resource, list(r.available_deviceIDs),
                                                  list(r.must_include_deviceIDs), r.allocation_size)
                out.append(dp.ContainerPreferredAllocationResponse(deviceIDs=ids))
            return dp.PreferredAllocationResponse(container_responses=out)
        return await self._refusing(context, call)

    async def Allocate(self, request, context):  # noqa: N802
        async def call():
            out = [_response(await self.plugin.allocate(self.resource, list(r.devices_ids)))
                   for r in request.container_requests]
            return dp.AllocateResponse(container_responses=out)
        return await self._refusing(context, call)

    async def PreStartContainer(self, request, context):  # noqa: N802
        async def call():
            await self.plugin.prestart(self.resource, list(request.devices_ids))
            return dp.PreStartContainerResponse()
        return await self._refusing(context, call)


class PodResourcesClient:
    """``PodResources`` over the kubelet's pod-resources socket (v1 ``List``)."""

    def __init__(self, socket_path: str | Path) -> None:
        self.target = f"unix://{Path(socket_path).resolve()}"

    async def list(self) -> list[KubeletPod]:
        async with grpc.aio.insecure_channel(self.target) as ch:
            resp = await pr_grpc.PodResourcesListerStub(ch).List(pr.ListPodResourcesRequest(), timeout=RPC_TIMEOUT_S)
        out = []
        for p in resp.pod_resources:
            per: dict[str, dict[str, tuple[str, ...]]] = {}
            for c in p.containers:
                got: dict[str, list[str]] = {}
                for d in c.devices:
                    got.setdefault(d.resource_name, []).extend(d.device_ids)
                per[c.name] = {r: tuple(ids) for r, ids in got.items()}
            out.append(KubeletPod(namespace=p.namespace, name=p.name, devices=per))
        return out


async def register(kubelet_socket: Path, resource: str) -> None:
    """Tell the kubelet about ``resource``; raises ``grpc.aio.AioRpcError`` when it refuses."""
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket.resolve()}") as ch:
        await dp_grpc.RegistrationStub(ch).Register(dp.RegisterRequest(
            version=API_VERSION, endpoint=socket_name(resource), resource_name=resource,
            options=dp.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)),
            timeout=RPC_TIMEOUT_S)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


class KubeletSession:
    """Serves every resource of ``devices`` on ``socket_dir`` and keeps it registered.

    ``run`` returns never; it re-serves and re-registers whenever ``kubelet.sock`` is recreated,
    one of its own sockets disappears, or the kubelet stops watching a resource for
    ``unwatched_s`` (a kubelet that tears down an old connection after a new registration drops
    the new one: kubelet ``runClient``), and polls ``unhealthy()`` (the set of unhealthy
    targets, ``gpu:<uuid>``/``nic:<device>``) every ``health_s``."""

    def __init__(self, *, socket_dir: str | Path, plugin: Plugin, devices: Devices,
                 unhealthy: Callable[[], frozenset[str]] = frozenset, poll_s: float = 1.0,
                 health_s: float = 5.0, unwatched_s: float = 5.0) -> None:
        self.dir = Path(socket_dir)
        self.plugin = plugin
        self.devices = devices
        self.unhealthy = unhealthy
        self.poll_s = poll_s
        self.health_s = health_s
        self.unwatched_s = unwatched_s
        self.servers: dict[str, grpc.aio.Server] = {}
        self.registrations = 0

    @property
    def kubelet_socket(self) -> Path:
        return self.dir / "kubelet.sock"


    async def retable(self, table, unhealthy: Callable[[], frozenset[str]]) -> None:
        """The node's topology changed but not its resources: the plugin allocates from ``table``,
        health is read through ``unhealthy``, and the kubelet's lists are updated."""
        self.plugin.table = table
        self.unhealthy = unhealthy
        await self.devices.update(table=table)
    async def _serve(self) -> None:
        await self._stop()
        for resource in self.devices.table.resources:
            path = self.dir / socket_name(resource)
            path.unlink(missing_ok=True)
            server = grpc.aio.server()
            dp_grpc.add_DevicePluginServicer_to_server(ResourceServicer(resource, self.plugin, self.devices), server)
            server.add_insecure_port(f"unix://{path.resolve()}")
            await server.start()
            self.servers[resource] = server
        for resource in self.servers:
            await register(self.kubelet_socket, resource)
        self.registrations += 1
        log("device plugin registered", node=self.plugin.node, resources=",".join(self.servers),
            registrations=self.registrations)

    async def _stop(self) -> None:
        """Stop every resource's server, all at once: each gives its calls 0.5 s, and a server
        whose ListAndWatch stream the kubelet holds open always waits its whole grace."""
        async with anyio.create_task_group() as tg:
            for server in self.servers.values():
                tg.start_soon(server.stop, 0.5)
        self.servers = {}

    def _own_sockets_present(self) -> bool:
        return all((self.dir / socket_name(r)).exists() for r in self.servers)

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ready after the first registration (or at once when no kubelet
        socket exists yet: it registers as soon as one appears)."""
        seen: tuple[int, int] | None = None
        started, next_health, watched_at = False, 0.0, time.monotonic()
        try:
            while True:
                now = _identity(self.kubelet_socket)
                if seen is None or all(self.devices.watchers.get(r) for r in self.servers):
                    watched_at = time.monotonic()
                unwatched = time.monotonic() - watched_at > self.unwatched_s
                if unwatched:
                    warn("the kubelet stopped watching; registering again", node=self.plugin.node)
                if now is not None and (now != seen or unwatched or not self._own_sockets_present()):
                    try:
                        await self._serve()
                        seen, watched_at = now, time.monotonic()
                    except grpc.aio.AioRpcError as e:
                        warn("device plugin registration failed", node=self.plugin.node, error=str(e.details())[:300])
                if not started:
                    task_status.started()
                    started = True
                if time.monotonic() >= next_health:
                    bad = frozenset(self.unhealthy())
                    if bad != self.devices.unhealthy:
                        warn("device health changed", node=self.plugin.node, unhealthy=",".join(sorted(bad)) or "-")
                        await self.devices.update(unhealthy=bad)
                    next_health = time.monotonic() + self.health_s
                await anyio.sleep(self.poll_s)
        finally:
            with anyio.CancelScope(shield=True):
                await self._stop()

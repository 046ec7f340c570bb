"""The kubelet's device manager as a test peer: ``dm-harness`` (tools/devicemanager), built from
k8s.io/kubernetes v1.36.3, spoken to in JSON lines (see the tool's header for the requests).

``bin_path()`` asks ``tools/devicemanager/build.sh --print-bin-dir`` where the binary is and
raises ``HarnessError`` (saying how to build it) when it is missing: never a silent skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

from phalanx_bus import Bus
from phalanx_kube.kvcluster import KvCluster

REPO = Path(__file__).resolve().parents[2]
BUILD_SH = REPO / "tools" / "devicemanager" / "build.sh"


class HarnessError(RuntimeError):
    pass


def bin_path() -> Path:
    how = ("build it with `bash tools/devicemanager/build.sh` (cached under ~/.cache/phalanx-kube; "
           "see tools/devicemanager/README.md)")
    if os.environ.get("CI"):
        how = "the CI job must run `bash tools/devicemanager/build.sh` before the deviceplugin tier"
    try:
        out = subprocess.run(["bash", str(BUILD_SH), "--print-bin-dir"], capture_output=True, text=True, timeout=30,
                             check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        raise HarnessError(f"cannot ask {BUILD_SH} for the bin dir ({e}); {how}") from e
    path = Path(out[-1]) / "dm-harness" if out else Path("dm-harness")
    if not os.access(path, os.X_OK):
        raise HarnessError(f"dm-harness missing at {path}; {how}")
    return path


class DeviceManager:
    """One running ``dm-harness``: the kubelet's device manager on ``socket_dir`` and its
    PodResources server on ``pod_resources_socket``. ``await start()``, ``await request(...)``,
    ``await stop()`` (a kubelet stop: a new one on the same ``socket_dir`` is a kubelet restart)."""

    def __init__(self, binary: Path, socket_dir: Path, pod_resources_socket: Path) -> None:
        self.binary, self.socket_dir, self.pod_resources_socket = binary, socket_dir, pod_resources_socket
        self._proc: anyio.abc.Process | None = None
        self._lines: BufferedByteReceiveStream | None = None
        self.stderr = b""

    async def start(self) -> None:
        self._proc = await anyio.open_process(
            [str(self.binary), "--socket-dir", str(self.socket_dir), "--pod-resources-socket",
             str(self.pod_resources_socket)], stderr=subprocess.DEVNULL)
        self._lines = BufferedByteReceiveStream(self._proc.stdout)
        with anyio.fail_after(30):
            ready = json.loads(await self._lines.receive_until(b"\n", 1 << 20))
        if not ready.get("ready"):
            raise HarnessError(f"dm-harness did not start: {ready}")

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self._proc is not None and self._lines is not None
        await self._proc.stdin.send((json.dumps({"op": op, **fields}) + "\n").encode())
        with anyio.fail_after(60):
            return json.loads(await self._lines.receive_until(b"\n", 16 << 20))

    async def admit(self, pod: dict[str, Any]) -> dict[str, Any]:
        return await self.request("admit", pod=pod)

    async def start_container(self, uid: str, container: str = "c0") -> dict[str, Any]:
        return await self.request("start", uid=uid, container=container)

    async def stop(self) -> None:
        if self._proc is None:
            return
        await self._proc.stdin.aclose()
        with anyio.move_on_after(10, shield=True):
            await self._proc.wait()
        if self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()
        self._proc = None


@asynccontextmanager
async def cluster_of(kind: str, request, plane=None):
    """(ClusterPort, create_pod, namespace) on the simulated cluster or the real apiserver (the
    session's, or ``plane``)."""
    namespace = f"dp-{uuid.uuid4().hex[:8]}"
    if kind == "sim":
        bus = await Bus.connect(request.getfixturevalue("nats_server").url, service="deviceplugin-test")
        sim = await KvCluster.open(bus)

        async def create(obj):
            return (await sim.apply_pod(obj)).raw
        try:
            yield sim, create, namespace
        finally:
            await bus.close()
        return
    from phalanx_kube.kube import KubeCluster

    plane = plane or request.getfixturevalue("kube")
    api = plane.api
    api.create_namespace(namespace)

    async def create(obj):
        return await anyio.to_thread.run_sync(api.create_pod, obj)
    try:
        async with await KubeCluster.open(str(plane.kubeconfig)) as cluster:
            yield cluster, create, namespace
    finally:  # the session's API server is shared: a Phalanx stack on it must not meet these pods
        await anyio.to_thread.run_sync(lambda: api.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods", {"gracePeriodSeconds": 0}, ok=(404,)))

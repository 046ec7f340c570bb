"""The four-node stack the controller, queue and preemption modules share (``stack4``): four
kwok nodes of 4 GPUs (one RDMA NIC each), two per network-pod, every node on its own HyperNode
and leaf switch, and every Phalanx service as its own process with ``--cluster kube``.

It is started once, on the first module that asks, and stopped after the last test that asks
(a session fixture, ended early by the module fixture of its last user). The modules that ask
run one after another (``users_first``): a second Phalanx stack on the same API server would
take the pods of another module's stack. Each module starts from what a fresh stack would
show: every test deletes its workloads, and the module fixture waits until Phalanx's ledger
holds no reservation before its first test runs. Namespaces, gangs (``<namespace>/...``),
Queues and PriorityClasses are unique per test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import yaml
from kubecontrollers import wait_for
from kubeharness import ControlPlane, KubeApi, fake_gpu_node, unique
from test_seed_examples import EXAMPLES, SERVICES, condition

from phalanx_bus import Bus
from phalanx_bus.records import read_all
from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_proto import subjects as S
from phalanx_proto.state import NodeLedger

TOPOLOGY_4GPU = EXAMPLES / "topology" / "pcie-4xL40S-handwritten.yaml"
NETWORK_POD = "phalanx.io/network-pod"
FIXTURE = "stack4"


def start_stack4(plane: ControlPlane, api: KubeApi, work) -> Stack:
    """Create the four nodes and start the stack on them; ``stack.network_pods`` maps each node
    to its network-pod."""
    api.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "lj-runtime"},
        "handler": "lj-runtime"}, ok=(409,))
    nodes = []
    for netpod in ("np-a", "np-b"):
        for _ in range(2):
            name = unique("e2e-ctl")
            labels = {"lj_runtimekit_enable": "true", "phalanx.io/hypernode": f"hn-{name}",
                      "phalanx.io/leaf-switch": f"leaf-{name}", NETWORK_POD: netpod}
            topo = yaml.safe_load(TOPOLOGY_4GPU.read_text())
            topo["node"] = name
            (work / f"{name}.yaml").write_text(yaml.safe_dump(topo))
            api.create_node(fake_gpu_node(name, gpus=4, labels=labels))
            nodes.append({"name": name, "labels": labels, "topology": f"{name}.yaml"})
    names = [n["name"] for n in nodes]
    wait_for(lambda: all(condition(api.get(f"/api/v1/nodes/{n}"), "Ready") for n in names), 30,
             "kwok to mark the nodes Ready")
    cluster_file = work / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump({"nodes": nodes}))
    kube_args = ["--cluster", "kube", "--kubeconfig", str(plane.kubeconfig)]
    stack = Stack(ClusterFile.load(cluster_file), workdir=str(work / "stack"),
                  service_args={s: kube_args for s in SERVICES})
    stack.start_nats()
    try:
        stack.start_services(timeout_s=90)
        wait_for(lambda: all(api.get(f"/api/v1/nodes/{n}")["status"]["capacity"].get("aliyun.com/gpu-core")
                             == "400" for n in names), 30, "topology-discovery to patch node capacity")
    except BaseException:
        stack.stop()
        raise
    stack.network_pods = {n["name"]: n["labels"][NETWORK_POD] for n in nodes}  # type: ignore[attr-defined]
    return stack


def reservations(stack: Stack) -> int:
    """How many reservations Phalanx's ledger holds."""
    async def count() -> int:
        bus = await Bus.connect(stack.url, service="test")
        try:
            good, _ = await read_all(await bus.kv(S.KV_LEDGER))
            return sum(len(r.value.allocations) for r in good if isinstance(r.value, NodeLedger))
        finally:
            await bus.close()

    return anyio.run(count)


def users_first(items: list[pytest.Item], tier: Path) -> None:
    """Reorder ``items`` in place: of the tests under ``tier``, the modules that ask for the
    shared stack first (in their order), then the others (in theirs); other tests keep their
    places."""
    at = [i for i, item in enumerate(items) if item.path.is_relative_to(tier)]
    users = {item.module for i in at if FIXTURE in (item := items[i]).fixturenames}
    ordered = sorted((items[i] for i in at), key=lambda item: item.module not in users)  # stable
    for i, item in zip(at, ordered, strict=True):
        items[i] = item


def _asked_for_later(request: pytest.FixtureRequest) -> bool:
    """Whether a test after this module's last one asks for the shared stack."""
    items = request.session.items
    mine = [i for i, item in enumerate(items) if item.module is request.module]
    return any(FIXTURE in item.fixturenames for item in items[max(mine, default=-1) + 1:])


@pytest.fixture(scope="session")
def stack4_shared(jobset_controller: ControlPlane, kube_api: KubeApi, tmp_path_factory) -> Iterator[Stack]:
    stack = start_stack4(jobset_controller, kube_api, tmp_path_factory.mktemp("e2e-ctl"))
    try:
        yield stack
    finally:
        stack.stop()  # once more is harmless when the last user stopped it


@pytest.fixture(scope="module")
def stack4(stack4_shared: Stack, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """The shared four-node stack, once Phalanx holds nothing (as a fresh one would)."""
    wait_for(lambda: reservations(stack4_shared) == 0, 60,
             "the ledger to hold no reservation left by an earlier module")
    yield stack4_shared
    if not _asked_for_later(request):
        stack4_shared.stop()

"""Required pod affinity and anti-affinity on the real stack (nats-server with auth and TLS,
every service its own process, the simulated cluster): two nodes of 8 V100, each its own leaf
switch. JobSet's exclusive placement (the terms its pod webhook injects, topologyKey the leaf
label) puts each job whole in its own leaf and a third job waits with kube-scheduler's
anti-affinity reason; a single pod with required anti-affinity against a label keeps off the
node where a pod Phalanx did not place carries that label (the node agent reports it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hostile import cleaned_env, hostile_stack
from phalanx_proto import subjects as S
from phalanx_proto.state import node_kube_state_decoder
from stackutil import bound_pods, gang_pod, gang_states, gpu_pod, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TOPOLOGY = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "topology" / \
    "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
LEAF = "phalanx.io/leaf-switch"
LEAVES = {"aff-a": "leaf-1", "aff-b": "leaf-2"}
JOB_KEY = "jobset.sigs.k8s.io/job-key"
REQ = "requiredDuringSchedulingIgnoredDuringExecution"
COORD = ["--resync-s", "0.5", "--backoff-base-s", "0.5", "--backoff-max-s", "2", "--reconcile-s", "1"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("affinity-cluster")
    nodes = [{"name": name, "topology": str(TOPOLOGY), "gpuModel": "Tesla V100-SXM2-16GB", "gpuMemoryMiB": 16384,
              "labels": {"lj_runtimekit_enable": "true", "phalanx.io/hypernode": f"hn-{name}", LEAF: leaf,
                         "phalanx.io/network-pod": "np-1"}} for name, leaf in LEAVES.items()]
    path = work / "cluster.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes}))
    yield from hostile_stack(tmp_path_factory.mktemp("affinity"), COORD, cluster=path)


@pytest.fixture
async def env(stack):
    async for e in cleaned_env(stack):
        yield e


def exclusive_job(job: str, members: int, gpus: int) -> list[dict]:
    """A JobSet job with ``alpha.jobset.sigs.k8s.io/exclusive-topology: phalanx.io/leaf-switch``:
    each pod with the terms JobSet's webhook injects (pkg/webhooks/pod_mutating_webhook.go)."""
    key = f"{job}-key"
    affinity = {
        "podAffinity": {REQ: [{"labelSelector": {"matchExpressions": [
            {"key": JOB_KEY, "operator": "In", "values": [key]}]}, "topologyKey": LEAF, "namespaceSelector": {}}]},
        "podAntiAffinity": {REQ: [{"labelSelector": {"matchExpressions": [
            {"key": JOB_KEY, "operator": "Exists"}, {"key": JOB_KEY, "operator": "NotIn", "values": [key]}]},
            "topologyKey": LEAF, "namespaceSelector": {}}]}}
    pods = []
    for i in range(members):
        p = gang_pod(f"{job}-{i}", gpus, job, members)
        p["metadata"]["labels"][JOB_KEY] = key
        p["spec"]["affinity"] = affinity
        pods.append(p)
    return pods


async def gang(bus, job: str):
    states = [s for gid, s in (await gang_states(bus)).items() if gid.rsplit(":", 1)[-1] == job]
    return states[0] if states else None


async def leaves_of(sim, job: str, members: int) -> set[str]:
    async def bound():
        got = {k: n for k, (n, _) in (await bound_pods(sim)).items() if k.startswith(f"default/{job}-")}
        return got if len(got) == members else None

    got = await wait_until(bound, 60, what=f"{job} bound")
    return {LEAVES[n] for n in got.values()}


async def test_exclusive_jobs_take_a_leaf_each_and_a_third_waits_with_the_anti_affinity_reason(env):
    _, bus, sim = env
    for p in exclusive_job("ja", 2, 2):
        await sim.apply_pod(p)
    first = await leaves_of(sim, "ja", 2)
    assert len(first) == 1, first  # the whole job in one leaf, though either node holds one member alone
    for p in exclusive_job("jb", 2, 2):
        await sim.apply_pod(p)
    second = await leaves_of(sim, "jb", 2)
    assert len(second) == 1 and second != first, (first, second)

    for p in exclusive_job("jc", 1, 1):  # 4 GPUs are free in each leaf: only the rule keeps it out
        await sim.apply_pod(p)

    async def waiting():
        s = await gang(bus, "jc")
        return s if s is not None and "anti-affinity" in s.reason else None

    s = await wait_until(waiting, 60, what="jc waiting with the anti-affinity reason")
    assert "2 node(s) didn't match pod anti-affinity rules" in s.reason, s.reason
    assert not [k for k in await bound_pods(sim) if k.startswith("default/jc-")]


async def test_a_pod_with_anti_affinity_keeps_off_the_node_of_a_pod_it_selects(env):
    _, bus, sim = env
    web = gpu_pod("web", 0, scheduler="default-scheduler", labels={"app": "web"})
    web["spec"]["nodeName"] = "aff-a"
    web["spec"]["containers"][0]["resources"] = {}
    await sim.apply_pod(web)

    async def reported():
        entry = await (await bus.kv(S.KV_NODE_STATE)).get("aff-a")
        state = node_kube_state_decoder.decode(entry.value) if entry is not None else None
        return state is not None and any(r.labels == {"app": "web"} for r in state.running)

    await wait_until(reported, 30, what="aff-a's agent reports the web pod")
    p = gpu_pod("apart", 8)  # without its term it would go to aff-a (equal nodes: the first name)
    p["spec"]["affinity"] = {"podAntiAffinity": {REQ: [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    await sim.apply_pod(p)

    async def bound():
        return (await bound_pods(sim)).get("default/apart")

    node, gpus = await wait_until(bound, 60, what="apart bound")
    assert (node, len(gpus)) == ("aff-b", 8)

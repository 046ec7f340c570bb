"""The seed's mig-demo through every real service process in the simulated cluster: placed on a
MIG-enabled A100 at a legal slot, the instance created and verified by mig-manager before the
bind, its UUID in the assignment annotation, and destroyed when the pod is deleted; a MIG pod
on a cluster without MIG-capable GPUs waits with that reason. (A slice count MIG does not have
is refused by gang-coordinator's intake: tests/unit/test_saga_identity.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import msgspec
import pytest
import yaml

from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION
from stackutil import connect, gang_states, ref, seed_nodes, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
MIG_CLUSTER = ROOT / "examples" / "clusters" / "mig-a100.yaml"


def mig_pod(name: str, slices: str, memory_gib: str = "4") -> dict:
    pod = yaml.safe_load((ROOT / "examples" / "pods" / "mig-demo.yaml").read_text())
    pod["metadata"]["name"] = name
    pod["spec"]["containers"][0]["resources"]["limits"] = {"aliyun.com/gpu-slice": slices,
                                                         "aliyun.com/gpu-memory": memory_gib}
    return pod


@pytest.fixture
def stack(tmp_path):
    s = Stack(ClusterFile.load(MIG_CLUSTER), workdir=str(tmp_path / "stack"))
    s.start_nats()
    yield s
    s.stop()


async def test_mig_demo_gets_a_verified_instance_that_is_destroyed_with_the_pod(stack):
    bus, sim = await connect(stack)
    try:
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        demo = yaml.safe_load((ROOT / "examples" / "pods" / "mig-demo.yaml").read_text())
        await sim.apply_pod(demo)

        async def bound():
            p = await sim.get_pod(ref("mig-demo"))
            return p if p is not None and p.node_name else None

        pod = await wait_until(bound, 60)
        a = json.loads(pod.annotations[ASSIGNMENT_ANNOTATION])
        assert (pod.node_name, a["mig_profile"], a["mig_start"] in (0, 4)) == ("a100-mig", "3g.20gb", True)
        assert a["mig_instance_uuid"].startswith("MIG-")
        records = await bus.kv("phx-mig")

        async def owned() -> list[dict]:
            return [o for e in await records.items() for o in msgspec.json.decode(e.value).get("instances", {}).values()]

        assert [(o["pod"]["name"], o["uuid"]) for o in await owned()] == [("mig-demo", a["mig_instance_uuid"])]

        await sim.delete_pod(pod.ref)

        async def destroyed():
            return not await owned() or None

        await wait_until(destroyed, 60)
        log = stack.procs["mig-manager@a100-mig"].log_path.read_text()
        assert "destroyed" in log
    finally:
        await bus.close()


async def test_mig_on_a_cluster_without_mig_capable_gpus_waits_with_that_reason(tmp_path):
    from stackutil import CLUSTER

    s = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path / "v100"))
    s.start_nats()
    try:
        bus, sim = await connect(s)
        await seed_nodes(s, sim)
        await anyio.to_thread.run_sync(s.start_services)
        await sim.apply_pod(mig_pod("mig-on-v100", "3"))

        async def pending():
            g = (await gang_states(bus)).get("default/mig-on-v100")
            return g if g is not None and g.phase == "backoff" else None

        state = await wait_until(pending, 30)
        assert state.reason == "0/2 nodes are available: 2 no MIG-capable GPU."
        await bus.close()
    finally:
        s.stop()

"""The simulated DRA driver's objects (phalanx_localstack.draslices) are valid for the real API
server (Kubernetes 1.36, resource.k8s.io/v1): every example topology's GPU pool (plain and
with DynamicMIG's counters and MIG devices), its NIC pool, device taints (DRADeviceTaints is on
in 1.36) and the DeviceClasses are accepted and read back as written."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubeharness import KubeApi, unique

from phalanx_localstack import draslices as ds

pytestmark = pytest.mark.e2e
RESOURCE = "/apis/resource.k8s.io/v1"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "topology"


def without_time_added(spec: dict) -> dict:
    for d in spec.get("devices", ()):
        for t in d.get("taints", ()):
            t.pop("timeAdded", None)
    return spec


def test_device_classes_are_accepted(kube_api: KubeApi):
    """(The classes this test made are deleted: ``gpu.nvidia.com`` serves ``nvidia.com/gpu``
    through DRA on nodes without the device plugin, which later tests must not inherit.)"""
    made = []
    try:
        for c in ds.device_classes():
            path = f"{RESOURCE}/deviceclasses/{c['metadata']['name']}"
            if kube_api.request("GET", path, ok=(404,))[0] == 404:
                made.append(path)
            out = kube_api.apply(c)
            assert out["spec"] == c["spec"]
    finally:
        for path in made:
            kube_api.delete(path)


@pytest.mark.parametrize("mig", [False, True], ids=["plain", "dynamic-mig"])
@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_nodes_pools_are_accepted_as_written(kube_api: KubeApi, path: Path, mig: bool):
    node = unique("dra-shape")
    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    slices = ds.gpu_slices(node, path, mig_devices=mig, taints={"gpu-0": [taint]}) + ds.nic_slices(node, path)
    try:
        for s in slices:
            out = kube_api.post(f"{RESOURCE}/resourceslices", s)
            assert without_time_added(out["spec"]) == s["spec"], s["metadata"]["name"]
        back = {d["name"]: d for s in kube_api.get(f"{RESOURCE}/resourceslices")["items"]
                if s["spec"]["pool"]["name"] == node for d in s["spec"].get("devices", ())}
        assert back["gpu-0"]["taints"][0]["timeAdded"]
    finally:
        for s in slices:
            kube_api.delete(f"{RESOURCE}/resourceslices/{s['metadata']['name']}")

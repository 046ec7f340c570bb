"""Helpers for tests that run the real stack: submit pods, wait for outcomes, audit the ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import anyio

from phalanx_bus import Bus
from phalanx_bus.records import read_all
from phalanx_kube.kvcluster import KvCluster
from phalanx_proto import subjects as S
from phalanx_proto.events import PodRef
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION
from phalanx_proto.kvrules import BucketRule
from phalanx_proto.state import NodeLedger, ledger_decoder

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "2x8v100.yaml"
"""The demo's 2 x 8-V100 cluster file."""


def gpu_pod(name: str, gpus: int, *, scheduler: str = "phalanx", labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
            "spec": {"schedulerName": scheduler, "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


async def connect(stack) -> tuple[Bus, KvCluster]:
    bus = await Bus.connect(stack.url, service="test")
    await bus.declare()
    sim = await KvCluster.open(bus)
    return bus, sim


async def seed_nodes(stack, sim: KvCluster) -> None:
    for node in stack.cluster.node_objects():
        await sim.apply_node(node)


async def ledger(bus: Bus) -> dict[str, NodeLedger]:
    """Every readable node ledger (a value that breaks the ledger's rule is skipped, as the
    services skip it; a double-booked one is read anyway, so ``audit_ledger`` sees it)."""
    good, bad = await read_all(await bus.kv(S.KV_LEDGER), BucketRule(ledger_decoder, lambda key, value: ""), pattern="*")
    return {r.value.node: r.value for r in good}


async def audit_ledger(bus: Bus) -> Counter:
    """Raise if any GPU is booked twice; return reservations per pod (``namespace/name``)."""
    per_pod: Counter = Counter()
    for node, led in (await ledger(bus)).items():
        used: Counter = Counter()
        for alloc in led.allocations.values():
            per_pod[str(alloc.assignment.pod)] += 1
            used.update(alloc.assignment.gpus)
        double = [g for g, n in used.items() if n > 1]
        assert not double, f"GPU(s) {double} on {node} booked twice: {led.allocations}"
    return per_pod


async def wait_until(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    with anyio.fail_after(timeout):
        while True:
            result = await predicate()
            if result:
                return result
            await anyio.sleep(interval)


async def bound_pods(sim: KvCluster) -> dict[str, tuple[str, tuple[int, ...]]]:
    out = {}
    for p in await sim.list_pods():
        if p.node_name:
            a = json.loads(p.annotations.get(ASSIGNMENT_ANNOTATION, "{}"))
            out[f"{p.namespace}/{p.name}"] = (p.node_name, tuple(a.get("gpus", ())))
    return out


async def gang_states(bus: Bus, *, tombstones: bool = False) -> dict:
    """Every readable gang state (unreadable values are skipped, as the services skip them);
    tombstones (the entries of gangs whose pods are all gone) only when asked for."""
    good, _ = await read_all(await bus.kv(S.KV_GANGS))
    return {r.value.gang_id: r.value for r in good if tombstones or r.value.members}


def ref(name: str) -> PodRef:
    return PodRef(namespace="default", name=name)


def gang_pod(name: str, gpus: int, gang: str, size: int, *, annotations: dict | None = None,
             priority: int | None = None) -> dict:
    """A JobSet member: label ``jobset.sigs.k8s.io/jobset-name`` and ``aliyun.com/min-member``."""
    pod = gpu_pod(name, gpus, labels={"jobset.sigs.k8s.io/jobset-name": gang, "aliyun.com/min-member": str(size)})
    pod["metadata"]["annotations"] = annotations or {}
    if priority is not None:
        pod["spec"]["priority"] = priority
    return pod


async def partial_gangs(bus: Bus, states: dict) -> list[str]:
    """Gangs with some but not all members reserved in the ledger (must always be empty)."""
    per_pod = await audit_ledger(bus)
    out = []
    for gid, s in states.items():
        held = [m for m in s.members if f"{m.pod.namespace}/{m.pod.name}" in per_pod]
        if held and len(held) < len(s.members) and s.phase != "scheduled":
            out.append(gid)
    return out


def replay_log(stack, *args: str) -> tuple[int, dict, str]:
    """``phalanx sim --replay --json ARGS`` as the read-only identity: exit code, document, stderr."""
    out = subprocess.run([sys.executable, "-m", "phalanx_cli.main", "sim", "--replay", "--json", "--quiet",
                          "--nats", stack.url, *args], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **stack.identity_env(S.READER)})
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else {}, out.stderr

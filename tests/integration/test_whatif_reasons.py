"""Counterfactual reasons on the real stack (real nats-server with TLS, every service): a pod
that does not fit is told what would start it — in its pending reason and in ``phalanx explain``
(``--json``: ``whatif.answers``) — and the answer is true: once the gang it names is deleted,
the pod starts, where the answer said. ``phalanx sim --from-live``, run as the reader on the same
cluster, starts from its reservations and gives the waiting pod the same answer, and ``phalanx
sim --replay`` decides every decision placement logged again, to the same answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_proto import subjects as S
from stackutil import (
    CLUSTER,
    bound_pods,
    connect,
    gang_states,
    gpu_pod,
    ref,
    replay_log,
    seed_nodes,
    wait_until,
)

pytestmark = pytest.mark.integration


def explain(stack: Stack, *args: str) -> subprocess.CompletedProcess:
    """``phalanx explain ARGS --nats URL`` as the read-only identity."""
    return subprocess.run([sys.executable, "-m", "phalanx_cli.main", "explain", *args, "--nats", stack.url],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **stack.identity_env(S.READER)})


async def _gang_of(bus, name: str):
    return next((s for s in (await gang_states(bus)).values() if any(m.pod.name == name for m in s.members)), None)


def test_a_pod_that_does_not_fit_is_told_what_would_start_it_and_that_is_true(tmp_path):
    stack = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path))
    stack.start_nats()
    try:
        anyio.run(_scenario, stack)
    finally:
        stack.stop()


async def _scenario(stack: Stack) -> None:
    bus, sim = await connect(stack)
    try:
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        # Two 6-GPU pods on the two 8-GPU nodes leave 2 GPUs free on each: 4 free, none 4 together.
        for name in ("hold-a", "hold-b"):
            await sim.apply_pod(gpu_pod(name, 6))
            await wait_until(lambda name=name: _bound(sim, name), 45)
        placed = await bound_pods(sim)
        assert placed["default/hold-a"][0] != placed["default/hold-b"][0]
        await sim.apply_pod(gpu_pod("wants-4", 4))

        async def answered():
            s = await _gang_of(bus, "wants-4")
            return s if s is not None and s.whatif is not None and "would start" in s.reason else None

        state = await wait_until(answered, 45)
        wait = state.whatif.answers[0]
        assert wait.probe == "wait" and wait.starts and wait.tier == "node" and wait.gpus == 2
        node = wait.domain
        holder = next(n for n in ("hold-a", "hold-b") if placed[f"default/{n}"][0] == node)
        holder_gang = (await _gang_of(bus, holder)).gang_id
        line = f"would start if 2 GPUs free on node {node} (held by gang {holder_gang})"
        assert wait.text == line
        assert state.reason.startswith("0/2 nodes are available") and state.reason.endswith(f"; {line}")
        assert [h.gang_id for h in wait.holders] == [holder_gang] and wait.holders[0].gpus == 6
        assert wait.holders[0].queue == "default" and wait.holders[0].age_s > 0

        out = await anyio.to_thread.run_sync(lambda: explain(stack, "default/wants-4", "--json"))
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["reason"].endswith(f"; {line}")
        answers = doc["whatif"]["answers"]
        assert answers[0]["probe"] == "wait" and answers[0]["text"] == line
        assert answers[0]["holders"][0]["gang_id"] == holder_gang
        assert "smaller" in [a["probe"] for a in answers]  # 2 GPUs per member would fit as things are
        text = await anyio.to_thread.run_sync(lambda: explain(stack, "default/wants-4"))
        assert "What if:" in text.stdout and f"  {line}" in text.stdout

        # phalanx sim --from-live, as the reader, starts from this cluster: the live reservations
        # stay to the end of its run, so a 2-GPU pod starts there and a 4-GPU one waits with the
        # same answer placement gave.
        sim_doc = await anyio.to_thread.run_sync(lambda: _sim_from_live(stack, stack.workdir))
        rows = {r["gang"]: r for r in sim_doc["gangs"]}
        assert rows["default/sim-2"]["start_s"] == 0.0 and rows["default/sim-4"]["start_s"] is None
        (waiting,) = sim_doc["pending"]
        assert waiting["gang"] == "default/sim-4" and waiting["reason"] == "0/2 nodes are available: 2 insufficient free GPUs."
        sim_wait = waiting["whatif"]["answers"][0]
        assert sim_wait["probe"] == "wait" and sim_wait["gpus"] == 2
        assert {h["gang_id"] for h in sim_wait["holders"]} <= {holder_gang, (await _gang_of(bus, "hold-b")).gang_id}

        # The answer is true: with the gang it names gone, the pod starts on the node it named.
        await sim.delete_pod(ref(holder))
        await wait_until(lambda: _bound(sim, "wants-4"), 45)
        assert (await bound_pods(sim))["default/wants-4"][0] == node
        async def scheduled():
            g = await _gang_of(bus, "wants-4")
            return g if g.phase == "scheduled" else None

        started = await wait_until(scheduled, 30)  # bound a moment before the record says so
        assert started.whatif is None and started.reason == ""

        # phalanx sim --replay, as the reader: every decision placement logged, the no-fits with
        # their reasons among them, decided again by this engine, gives the same answer.
        code, log, err = await anyio.to_thread.run_sync(lambda: replay_log(stack))
        assert code == 0, err
        assert log["differ"] == 0 and log["replayed"] >= 4, log  # hold-a, hold-b, wants-4 (refused, placed)
        (replica,) = log["replicas"]
        assert replica["bases"] >= 1 and replica["gaps"] == 0 and replica["not_replayable"] == 0
    finally:
        await bus.close()


WORKLOAD = """
apiVersion: v1
kind: Pod
metadata: {name: sim-2, namespace: default, annotations: {sim.phalanx.io/duration: 1h}}
spec:
  schedulerName: phalanx
  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "2"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: sim-4, namespace: default, annotations: {sim.phalanx.io/arrival: 2h, sim.phalanx.io/duration: 1h}}
spec:
  schedulerName: phalanx
  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "4"}}}]
"""


def _sim_from_live(stack: Stack, workdir) -> dict:
    """``phalanx sim --from-live --json`` as the read-only identity."""
    path = Path(workdir) / "sim-workload.yaml"
    path.write_text(WORKLOAD)
    out = subprocess.run([sys.executable, "-m", "phalanx_cli.main", "sim", "--from-live", "--nats", stack.url,
                          "--workload", str(path), "--duration", "4h", "--json", "--quiet"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, **stack.identity_env(S.READER)})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def _bound(sim, name: str) -> bool:
    return f"default/{name}" in await bound_pods(sim)

"""``phalanx explain`` and ``phalanx events`` against the real stack on the demo cluster, run as
the commands a user types (subprocesses): ``explain`` with the read-only ``reader`` identity,
``events`` of the whole saga with the admin identity (a subscriber may read gang status and
topology only; tests/hostile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import anyio
import pytest

from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_proto import subjects as S
from stackutil import CLUSTER, bound_pods, connect, gang_states, gpu_pod, seed_nodes, wait_until

pytestmark = pytest.mark.integration

REASON = "0/2 nodes are available: 2 insufficient free GPUs"
WHAT_IF = "would start with 8 GPUs per member instead of 9 GPUs"
"""The counterfactual placement appends (docs/whatif.md): no node has 9 GPUs, one has 8 free."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path_factory.mktemp("stack")))
    s.start_nats()

    async def setup() -> None:
        bus, sim = await connect(s)
        try:
            await seed_nodes(s, sim)
            await anyio.to_thread.run_sync(s.start_services)
            await sim.apply_pod(gpu_pod("fits-2gpu", 2))
            await sim.apply_pod(gpu_pod("too-big-9gpu", 9))
            await wait_until(lambda: _bound(sim, "default/fits-2gpu"), 45)
            await wait_until(lambda: _pending_with_reason(bus, "too-big-9gpu"), 45)
        finally:
            await bus.close()

    try:
        anyio.run(setup)
        yield s
    finally:
        s.stop()


async def _bound(sim, key):
    return key in await bound_pods(sim)


async def _pending_with_reason(bus, name):
    for st in (await gang_states(bus)).values():
        if any(m.pod.name == name for m in st.members) and st.reason:
            return st
    return None


def explain(stack: Stack, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``phalanx explain ARGS --nats URL`` as the read-only identity."""
    return subprocess.run([sys.executable, "-m", "phalanx_cli.main", "explain", *args, "--nats", stack.url],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **stack.identity_env(S.READER)})


def test_explain_a_pending_pod_gives_its_gang_phase_attempt_and_the_real_reason(stack):
    out = explain(stack, "default/too-big-9gpu", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["status"] == "pending" and r["managed"] is True and r["pod"]["node"] is None
    assert r["gang"]["members"] == ["default/too-big-9gpu"]
    assert r["gang"]["phase"] in ("backoff", "placing", "waiting") and r["gang"]["attempt"] >= 1
    assert r["reason"] == f"{REASON}; {WHAT_IF}"  # placement's own words, as gang-coordinator stored them
    assert [(a["probe"], a["text"], a["change"]) for a in r["whatif"]["answers"]] == [
        ("smaller", WHAT_IF, "gpus 9 -> 8")]
    assert r["assignment"] is None
    warnings = [e for e in r["events"] if e["type"] == "Warning" and e["reason"] == "FailedScheduling"]
    assert warnings and REASON in warnings[-1]["message"]
    assert r["condition"]["status"] == "False" and REASON in r["condition"]["message"]
    assert "trace_id" in r  # GangState.trace_id: null until gang-coordinator records one

    text = explain(stack, "default/too-big-9gpu")
    assert text.returncode == 0, text.stderr
    assert f"Reason:      {REASON}; {WHAT_IF}" in text.stdout
    assert f"What if:\n  {WHAT_IF}\n" in text.stdout
    assert "Status:      pending" in text.stdout and "FailedScheduling" in text.stdout


def test_explain_a_scheduled_pod_gives_its_assignment_and_scheduled_event(stack):
    out = explain(stack, "default/fits-2gpu", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["status"] == "bound" and r["reason"] == ""
    assert r["gang"]["phase"] == "scheduled" and r["gang"]["bound"] == ["default/fits-2gpu"]
    assert r["assignment"]["node"] == r["pod"]["node"] and len(r["assignment"]["gpus"]) == 2
    assert [e["reason"] for e in r["events"]][-1] == "Scheduled"
    text = explain(stack, "default/fits-2gpu")
    assert f"Status:      bound to {r['pod']['node']}" in text.stdout
    assert f"GPUs {','.join(map(str, r['assignment']['gpus']))}" in text.stdout


def test_explain_says_when_there_is_no_such_pod_or_the_argument_is_bad(stack):
    missing = explain(stack, "default/nope")
    assert missing.returncode == 1 and "not found" in missing.stderr
    bad = explain(stack, "a/b/c")
    assert bad.returncode == 2 and "NAMESPACE/POD" in bad.stderr


def test_events_prints_the_saga_of_a_new_pod_as_json_lines(stack):
    proc = subprocess.Popen([sys.executable, "-m", "phalanx_cli.main", "events", "--nats", stack.url, "--json",
                             "--subject", "phx.gang.>", "--timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        line = proc.stderr.readline()
        while "listening" not in line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stderr.readline()
        assert "listening on phx.gang.>" in line, line

        async def submit() -> None:
            bus, sim = await connect(stack)
            try:
                await sim.apply_pod(gpu_pod("watched-1gpu", 1))
                await wait_until(lambda: _bound(sim, "default/watched-1gpu"), 45)
            finally:
                await bus.close()

        anyio.run(submit)
        seen: list[dict] = []
        while time.monotonic() < deadline + 30:
            doc = json.loads(proc.stdout.readline())
            if doc["event"].get("gang_id", "").endswith("watched-1gpu"):
                seen.append(doc)
            if any(d["kind"] == "gang.scheduled" for d in seen):
                break
    finally:
        proc.terminate()
        proc.wait(10)
    kinds = [d["kind"] for d in seen]
    for kind in ("placement.place", "gang.reserved", "bind.pods", "gang.binds_done", "gang.scheduled"):
        assert kind in kinds, kinds
    assert kinds.index("placement.place") < kinds.index("gang.reserved") < kinds.index("gang.binds_done")
    placed = next(d for d in seen if d["kind"] == "gang.reserved")
    assert placed["subject"].startswith("phx.gang.coord.") and placed["time"].endswith("Z")


def test_explain_a_pod_placed_while_binder_is_down_says_where_it_is_reserved_and_that_it_is_being_bound(stack):
    # Without MIG a placed attempt's record stays placing while its binds are out (docs/saga.md,
    # "One write fewer"); explain reads the ledger to say the pod is placed, not still placing.
    stack.kill("binder")
    try:
        async def submit() -> None:
            bus, sim = await connect(stack)
            try:
                await sim.apply_pod(gpu_pod("waits-for-binder", 1))
            finally:
                await bus.close()

        anyio.run(submit)
        deadline = time.monotonic() + 45
        r: dict = {}
        while time.monotonic() < deadline:
            out = explain(stack, "default/waits-for-binder", "--json")
            assert out.returncode == 0, out.stderr
            r = json.loads(out.stdout)
            if r["assignment"] is not None:
                break
            time.sleep(0.3)
        assert r["status"] == "pending" and r["gang"]["phase"] == "placing", r
        assert r["reason"] == f"gang placed: reserved on {r['assignment']['node']}, being bound"
    finally:
        stack.restart("binder")

"""A queue's minimum runtime before preemption on the real stack (nats-server with auth and TLS,
every service its own process, 2 × 8 V100 simulated): queue ``mr`` says
``preemptMinRuntime: 8s``. A priority-1 gang of 2 × 8 GPUs fills the cluster; a priority-10
gang of 8 GPUs of the same queue arrives a second later. It is not a victim yet: nothing is
evicted, the preemptor's pods and ``phalanx explain`` say from when it may preempt (the young
gang's start + 8 s), and its backoff ends exactly then — gang-coordinator retries it at that
time, not on a timer loop (one failed attempt, not one per backoff). Then the planner takes
the now old-enough gang, binder evicts it whole, and the preemptor binds on its GPUs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import anyio
import pytest

from hostile import audited, cleaned_env, hostile_stack
from phalanx_proto import subjects as S
from phalanx_proto.kubeapi import QUEUE_LABEL
from phalanx_rules.preemption import when_text
from stackutil import gang_pod, gang_states, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

MIN_RUNTIME_S = 8.0
COORD = ["--queue-sync-s", "0.3", "--resync-s", "0.5", "--backoff-base-s", "1", "--backoff-max-s", "2",
         "--reconcile-s", "1"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from hostile_stack(tmp_path_factory.mktemp("min-runtime"), COORD)


@pytest.fixture
async def env(stack):
    async for e in cleaned_env(stack):
        yield e


def member(name: str, gpus: int, gang: str, size: int, priority: int) -> dict:
    pod = gang_pod(name, gpus, gang, size, priority=priority)
    pod["metadata"]["labels"][QUEUE_LABEL] = "mr"
    return pod


async def test_a_young_gang_is_no_victim_until_its_minimum_runtime_then_the_preemptor_takes_it_at_that_time(env, stack):
    _, bus, sim = env
    await sim.apply_queue({"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": "mr"},
                           "spec": {"preemption": {"preemptMinRuntime": f"{MIN_RUNTIME_S:g}s"}}})
    await anyio.sleep(1.0)  # gang-coordinator has read it (--queue-sync-s 0.3)
    async with audited(bus):
        for i in range(2):
            await sim.apply_pod(member(f"lo-{i}", 8, "lo", 2, priority=1))

        async def lo_started() -> float | None:
            s = next((s for g, s in (await gang_states(bus)).items() if g.endswith(":lo")), None)
            return s.attempt_started_at if s is not None and s.phase == "scheduled" else None

        started = await wait_until(lo_started, 60, what="the priority-1 gang running on the 16 GPUs")
        await anyio.sleep(1.0)
        await sim.apply_pod(member("hi-0", 8, "hi", 1, priority=10))
        due = started + MIN_RUNTIME_S

        async def hi_waiting():
            s = next((s for g, s in (await gang_states(bus)).items() if g.endswith(":hi")), None)
            return s if s is not None and s.phase == "backoff" and "not preempting yet" in s.reason else None

        waiting = await wait_until(hi_waiting, 30, what="the preemptor told it may not preempt yet")
        assert time.time() < due, "the test was too slow to see the gang protected"
        assert f"it may preempt from {when_text(due)} and is tried again then" in waiting.reason, waiting.reason
        assert waiting.backoff_until == pytest.approx(due, abs=1e-6)  # retried then, not after a backoff
        assert {p.name for p in await sim.list_pods() if p.node_name} == {"lo-0", "lo-1"}  # nothing evicted

        shown = await anyio.to_thread.run_sync(lambda: _explain(stack, "default/hi-0"))
        assert f"may preempt from {when_text(due)}" in shown, shown

        async def hi_bound() -> float | None:
            pods = {p.name: p for p in await sim.list_pods()}
            return time.time() if "hi-0" in pods and pods["hi-0"].node_name else None

        bound_at = await wait_until(hi_bound, 60, interval=0.1, what="the preemptor bound once the victim is old enough")
        assert bound_at >= due
        assert bound_at - due < 5.0, bound_at - due  # at that time: a timer loop of 1-2 s backoffs is not needed
        assert not [p.name for p in await sim.list_pods() if p.name.startswith("lo-")]  # the victim went, whole
        hi = next(s for g, s in (await gang_states(bus)).items() if g.endswith(":hi"))
        assert hi.failures <= 2, hi.failures  # its first attempt, perhaps the eviction's wait; no retry per backoff


def _explain(stack, pod: str) -> str:
    out = subprocess.run([sys.executable, "-m", "phalanx_cli.main", "explain", pod, "--nats", stack.url],
                         capture_output=True, text=True, timeout=60, env={**os.environ, **stack.identity_env(S.READER)})
    assert out.returncode == 0, out.stderr
    return out.stdout

"""Two placement replicas racing on a nearly full cluster never book a GPU twice."""

from __future__ import annotations

import random

import anyio
import pytest

from phalanx_runtime.stack import ClusterFile, Stack
from stackutil import CLUSTER, audit_ledger, bound_pods, connect, gang_states, gpu_pod, seed_nodes, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]



async def test_two_placement_replicas_racing_never_double_book_and_do_conflict(tmp_path):
    stack = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path / "stack"), replicas={"placement": 2},
                  service_args={"placement": ["--debug-decide-delay-s", "0.05"]})
    stack.start_nats()
    try:
        bus, sim = await connect(stack)
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        rng = random.Random(7)
        sizes = [rng.choice([1, 1, 2, 3]) for _ in range(14)]
        audits = []

        async def audit_forever():
            while True:
                audits.append(await audit_ledger(bus))  # raises on any double booking
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(audit_forever)
            for i, n in enumerate(sizes):
                await sim.apply_pod(gpu_pod(f"r{i}", n))

            async def settled():
                states = await gang_states(bus)
                done = [s for s in states.values() if s.phase in ("scheduled", "backoff")]
                return states if len(done) == len(sizes) else None

            states = await wait_until(settled, 90)
            tg.cancel_scope.cancel()
        bound = await bound_pods(sim)
        used = [(node, g) for node, gpus in bound.values() for g in gpus]
        assert len(used) == len(set(used)) <= 16
        per_pod = await audit_ledger(bus)
        assert set(per_pod) == set(bound) and set(per_pod.values()) == {1}
        scheduled = {gid for gid, s in states.items() if s.phase == "scheduled"}
        assert {f"default/r{i}" for i in range(len(sizes))} - scheduled == {
            gid for gid, s in states.items() if s.phase == "backoff"}
        assert sum(n for i, n in enumerate(sizes) if f"default/r{i}" in scheduled) == len(used)
        assert len(audits) > 10
        logs = "".join(stack.procs[p].log_path.read_text() for p in ("placement", "placement#2"))
        assert "ledger conflict, deciding again" in logs
        assert "reserved" in stack.procs["placement"].log_path.read_text()
        assert "reserved" in stack.procs["placement#2"].log_path.read_text()
        await bus.close()
    finally:
        stack.stop()

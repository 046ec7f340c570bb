"""Every service serves Prometheus metrics on its health port, and they move with the saga."""

from __future__ import annotations

import urllib.request

import anyio
import pytest

from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_telemetry import exposition
from stackutil import CLUSTER, connect, gpu_pod, seed_nodes, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def scrape(stack: Stack, name: str) -> dict[str, float]:
    """``/metrics`` of one stack process as ``{sample with labels: value}``."""
    port = int(stack.procs[name].ready_file.read_text().split()[1])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    return exposition.samples(text)


@pytest.fixture(scope="module")
def stack():
    """One stack for the two tests that read it (the health endpoints change nothing)."""
    s = Stack(ClusterFile.load(CLUSTER))
    s.start_nats()
    s.start_services()
    yield s
    s.stop()


async def test_a_running_stack_serves_metrics_that_reflect_a_bound_pod_and_a_pending_one(stack):
    bus, sim = await connect(stack)
    try:
        await seed_nodes(stack, sim)
        await sim.apply_pod(gpu_pod("two", 2))
        await sim.apply_pod(gpu_pod("too-big", 9))

        async def bound():
            return any(p.name == "two" and p.node_name for p in await sim.list_pods())

        await wait_until(bound, 60, what="pod two bound")

        model = "Tesla V100-SXM2-16GB"
        fragmentation = f'phalanx_cluster_fragmentation_ratio{{model="{model}"}}'

        async def placement_counted():
            # The gauges are computed from placement's view when read; under load a node's
            # report can be a moment late (its node then left out), so wait for the view to hold
            # both nodes' GPUs (the fragmentation of 14 free GPUs) rather than read once.
            m = await anyio.to_thread.run_sync(scrape, stack, "placement")
            placed = m.get('phalanx_placement_decision_duration_seconds_count{outcome="placed"}', 0)
            no_fit = m.get('phalanx_placement_decision_duration_seconds_count{outcome="no_fit"}', 0)
            settled = m.get(fragmentation) == pytest.approx(6 / 14)
            return m if placed >= 1 and no_fit >= 1 and settled else None

        m = await wait_until(placement_counted, 60, what="placement metrics, both nodes in the view")
        gpus = {k: v for k, v in m.items() if k.startswith("phalanx_gpus_allocated{")}
        assert sum(gpus.values()) == 2 and all(f'model="{model}"' in k and 'mode="whole"' in k for k in gpus)
        assert m[fragmentation] == pytest.approx(6 / 14)
        assert m['phalanx_bus_events_total{consumer="placement",kind="placement.place",outcome="ack"}'] >= 2
        assert 'phalanx_ledger_commit_conflicts_total' in m

        b = await anyio.to_thread.run_sync(scrape, stack, "binder")
        assert b["phalanx_pod_pending_to_bound_seconds_count"] == 1
        assert b['phalanx_binds_total{result="bound"}'] == 1
        assert not any("pod=" in k or "two" in k for k in b), "pod names must never be labels"

        # Lag is sampled every few seconds; once sampled the placement consumer has caught up.
        async def lag_sampled():
            m = await anyio.to_thread.run_sync(scrape, stack, "placement")
            key = 'phalanx_bus_consumer_pending_messages{stream="PHX_GANG",consumer="placement"}'
            return key in m and m[key] == 0

        await wait_until(lag_sampled, 30, what="consumer lag sampled")
        for name in stack.procs:
            assert "phalanx_gang_attempts_total" in {k.split("{")[0] for k in (await anyio.to_thread.run_sync(scrape, stack, name))}
    finally:
        await bus.close()


def test_health_endpoints_still_answer_next_to_metrics(stack):
    port = int(stack.procs["binder"].ready_file.read_text().split()[1])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
        assert (resp.status, resp.read()) == (200, b"ok\n")


async def test_placement_counts_a_node_whose_agent_stopped_beating_as_stale(tmp_path):
    s = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path / "stack"),
              service_args={"placement": ["--heartbeat-stale-s", "6"], "topology-discovery": ["--heartbeat-s", "1"]})
    s.start_nats()
    try:
        await anyio.to_thread.run_sync(s.start_services)
        first = await anyio.to_thread.run_sync(scrape, s, "placement")
        assert {k: v for k, v in first.items() if k.startswith("phalanx_placement_nodes")} == {
            'phalanx_placement_nodes{state="fresh"}': 2.0, 'phalanx_placement_nodes{state="stale"}': 0.0,
            'phalanx_placement_nodes{state="invalid"}': 0.0}
        s.kill("topology-discovery@v100-b")

        async def one_stale():
            m = await anyio.to_thread.run_sync(scrape, s, "placement")
            counts = {k: v for k, v in m.items() if k.startswith("phalanx_placement_nodes")}
            return counts if counts.get('phalanx_placement_nodes{state="stale"}') == 1.0 else None

        assert await wait_until(one_stale, 60, what="v100-b counted stale") == {
            'phalanx_placement_nodes{state="fresh"}': 1.0, 'phalanx_placement_nodes{state="stale"}': 1.0,
            'phalanx_placement_nodes{state="invalid"}': 0.0}
    finally:
        s.stop()

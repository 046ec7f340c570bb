"""The peers benchmark's gang figures, computed from create times and bindings alone."""

from __future__ import annotations

import math

import pytest

from phalanx_bench.peers import Layout, Member, gang_metrics

LAYOUT = Layout(32, hypernode=2, leaf=8, netpod=16)


def gang(name: str, size: int) -> list[Member]:
    return [Member(f"{name}-m{i}", name, size) for i in range(size)]


def test_tiers_nest_and_the_tightest_tier_follows_the_gang_size():
    assert [LAYOUT.tightest(g) for g in (1, 8, 9, 16, 17, 64, 65, 128, 129)] == [
        "node", "node", "hypernode", "hypernode", "leaf", "leaf", "netpod", "netpod", "cluster"]
    assert LAYOUT.tier_of(["peer-000", "peer-001"]) == "hypernode"
    assert LAYOUT.tier_of(["peer-000", "peer-007"]) == "leaf"
    assert LAYOUT.tier_of(["peer-000", "peer-015"]) == "netpod"
    assert LAYOUT.tier_of(["peer-015", "peer-016"]) == "cluster"
    assert LAYOUT.labels(17) == {"phalanx.io/hypernode": "hn-8", "phalanx.io/leaf-switch": "leaf-2",
                                 "phalanx.io/network-pod": "pod-1"}
    with pytest.raises(ValueError):
        Layout(8, hypernode=3, leaf=8, netpod=16)


def test_a_gang_on_one_node_is_tight_and_its_time_runs_from_first_create_to_last_bind():
    ms = gang("a", 8)
    created = {m.pod: 10.0 + i for i, m in enumerate(ms)}
    bound = {m.pod: (20.0 + i, "peer-003") for i, m in enumerate(ms)}
    r = gang_metrics(LAYOUT, ms, created, bound, end=40.0)
    assert (r["whole"], r["gang_p50_s"], r["tightest_pct"], r["split_netpods"]) == (1, 17.0, 100.0, 0)
    assert r["pods_per_s"] == pytest.approx(8 / 17)
    # Members bound at 20..27 held their GPU until the last one bound at 27: 7+6+...+0.
    assert r["held_partial_gpu_s"] == pytest.approx(28.0)
    assert (r["held_partial_peak_gpus"], r["longest_partial_s"], r["partial_at_end"]) == (7, 7.0, 0)
    assert r["idle_gpus_while_waiting"] == 0


def test_a_gang_spread_over_two_network_pods_is_split_and_not_tight():
    ms = gang("b", 8)
    created = {m.pod: 0.0 for m in ms}
    bound = {m.pod: (1.0, "peer-015" if i < 4 else "peer-016") for i, m in enumerate(ms)}
    r = gang_metrics(LAYOUT, ms, created, bound, end=5.0)
    assert (r["tightest_pct"], r["split_netpods"]) == (0.0, 1)


def test_a_partly_bound_gang_holds_its_gpus_until_the_end_and_counts_as_a_deadlock_risk():
    held, waiting = gang("c", 4), gang("d", 64)
    ms = held + waiting
    created = {m.pod: 0.0 for m in ms}
    bound = {m.pod: (1.0, "peer-000") for m in held[:3]} | {m.pod: (2.0, "peer-001") for m in waiting[:8]}
    r = gang_metrics(LAYOUT, ms, created, bound, end=11.0)
    assert (r["whole"], r["partial_at_end"], math.isinf(r["gang_p50_s"])) == (0, 2, True)
    assert r["held_partial_gpu_s"] == pytest.approx(3 * 10 + 8 * 9)
    assert r["held_partial_peak_gpus"] == 11
    # 256 GPUs, 11 bound, all of them by incomplete gangs: every GPU idles while gangs wait.
    assert r["idle_gpus_while_waiting"] == 256
    assert math.isnan(r["tightest_pct"])


def test_single_pods_count_for_throughput_but_not_as_gangs():
    ms = [Member(f"s{i}", "", 1) for i in range(4)]
    r = gang_metrics(LAYOUT, ms, {m.pod: 0.0 for m in ms}, {m.pod: (2.0, "peer-000") for m in ms}, end=3.0)
    assert (r["gangs"], r["bound"], r["pods_per_s"], r["idle_gpus_while_waiting"]) == (0, 4, 2.0, 0)

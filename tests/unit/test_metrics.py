"""The Prometheus text exposition of phalanx_telemetry.metrics, and its bounded label sets."""

from __future__ import annotations

import math

import pytest

from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.topology import Gpu, NodeTopology
from phalanx_telemetry import allocation, exposition, metrics
from phalanx_telemetry.prom import Counter, Gauge, Histogram, MetricError, Registry


def fresh() -> Registry:
    reg = Registry()
    reg._dropped = Counter("phalanx_metrics_dropped_series_total", "dropped", ["metric"], registry=reg)
    return reg


def test_a_counter_renders_help_type_and_one_sample_per_label_set_sorted():
    reg = fresh()
    c = Counter("x_events_total", "Events seen.", ["consumer", "outcome"], registry=reg)
    c.inc(consumer="b", outcome="ack")
    c.inc(2, consumer="a", outcome="nak")
    c.inc(consumer="b", outcome="ack")
    assert reg.get("x_events_total").render() == [
        "# HELP x_events_total Events seen.",
        "# TYPE x_events_total counter",
        'x_events_total{consumer="a",outcome="nak"} 2',
        'x_events_total{consumer="b",outcome="ack"} 2',
    ]


def test_a_gauge_collected_on_render_shows_the_value_of_the_moment_it_is_read_until_its_collector_is_removed():
    reg = fresh()
    g = Gauge("x_free_gpus", "Free GPUs.", registry=reg)
    free = [3]
    remove = reg.collect_on_render(lambda: g.set(free[0]))
    assert "x_free_gpus 3" in reg.render().splitlines()
    free[0] = 1
    assert "x_free_gpus 1" in reg.render().splitlines()
    remove()
    free[0] = 7
    assert "x_free_gpus 1" in reg.render().splitlines()


def test_an_unlabelled_counter_is_exported_as_zero_before_its_first_increment():
    reg = fresh()
    Counter("x_conflicts_total", "Conflicts.", registry=reg)
    assert "x_conflicts_total 0" in reg.render().splitlines()


def test_a_histogram_has_cumulative_buckets_an_inf_bucket_sum_and_count():
    reg = fresh()
    h = Histogram("x_duration_seconds", "Time.", ["kind"], buckets=(0.1, 1.0), registry=reg)
    for v in (0.05, 0.5, 0.5, 3.0):
        h.observe(v, kind="a")
    assert h.render()[2:] == [
        'x_duration_seconds_bucket{kind="a",le="0.1"} 1',
        'x_duration_seconds_bucket{kind="a",le="1"} 3',
        'x_duration_seconds_bucket{kind="a",le="+Inf"} 4',
        'x_duration_seconds_sum{kind="a"} 4.05',
        'x_duration_seconds_count{kind="a"} 4',
    ]


def test_label_values_and_help_are_escaped_as_the_format_requires():
    reg = fresh()
    g = Gauge("x_value", 'Line one\nback\\slash.', ["node"], registry=reg)
    g.set(1.5, node='a"b\\c\nd')
    assert g.render() == [
        "# HELP x_value Line one\\nback\\\\slash.",
        "# TYPE x_value gauge",
        'x_value{node="a\\"b\\\\c\\nd"} 1.5',
    ]


@pytest.mark.parametrize("name, kind, labels, why", [
    ("a counter whose name lacks _total", Counter, ("x_events", []), "must end in _total"),
    ("a pod name as a label", Gauge, ("x_pods", ["pod"]), "unbounded"),
    ("a reserved label name", Gauge, ("x_le", ["le"]), "invalid label"),
    ("a name with a dash", Gauge, ("x-bad", []), "invalid metric name"),
])
def test_a_metric_declared_against_the_naming_rules_is_refused(name, kind, labels, why):
    with pytest.raises(MetricError, match=why):
        kind(*labels[:1], "help", labels[1], registry=fresh())


def test_a_value_outside_the_allowed_set_is_recorded_as_other():
    reg = fresh()
    c = Counter("x_rollbacks_total", "R.", ["reason"], allowed={"reason": ("deadline",)}, registry=reg)
    c.inc(reason="deadline")
    c.inc(reason="something the coordinator made up")
    assert (c.value(reason="deadline"), c.value(reason="other")) == (1, 1)


def test_series_past_the_limit_are_dropped_and_counted():
    reg = fresh()
    g = Gauge("x_lag", "Lag.", ["consumer"], max_series=2, registry=reg)
    for name in ("a", "b", "c", "d"):
        g.set(1, consumer=name)
    assert [line for line in g.samples()] == ['x_lag{consumer="a"} 1', 'x_lag{consumer="b"} 1']
    assert reg._dropped.value(metric="x_lag") == 2


def test_using_undeclared_labels_is_an_error():
    g = Gauge("x_g", "G.", ["node"], registry=fresh())
    with pytest.raises(MetricError, match="declared"):
        g.set(1, node="a", model="b")


def test_replace_drops_series_that_are_no_longer_reported():
    g = Gauge("x_alloc", "A.", ["node"], registry=fresh())
    g.replace([({"node": "a"}, 1), ({"node": "b"}, 2)])
    g.replace([({"node": "b"}, 3)])
    assert g.samples() == ['x_alloc{node="b"} 3']


def test_the_process_registry_exports_the_documented_names_with_prometheus_suffixes():
    names = set(metrics.REGISTRY.names())
    assert {
        "phalanx_bus_handler_duration_seconds", "phalanx_bus_messages_total", "phalanx_bus_redeliveries_total",
        "phalanx_bus_consumer_pending_messages", "phalanx_placement_decision_duration_seconds",
        "phalanx_ledger_commit_conflicts_total", "phalanx_gpus_allocated", "phalanx_gpu_core_allocated_percent",
        "phalanx_gpu_memory_allocated_bytes", "phalanx_cluster_fragmentation_ratio",
        "phalanx_pod_pending_to_bound_seconds", "phalanx_gang_attempts_total", "phalanx_gang_rollbacks_total",
        "phalanx_gangs",
    } <= names
    for m in (metrics.REGISTRY.get(n) for n in names):
        if isinstance(m, Histogram) and "duration" in m.name:
            assert m.name.endswith("_seconds")
    text = metrics.REGISTRY.render()
    assert text.endswith("\n") and "# TYPE phalanx_gangs gauge" in text


def _gpus(n: int, model: str = "V100") -> tuple[Gpu, ...]:
    return tuple(Gpu(index=i, name=f"GPU{i}", model=model, memory_mib=16384) for i in range(n))


def _a(node: str, gpus: tuple[int, ...], **kw) -> Assignment:
    return Assignment(pod=PodRef(namespace="d", name=f"p{gpus}"), node=node, gpus=gpus, **kw)


def test_allocation_counts_gpus_core_and_memory_by_node_model_and_mode_and_fragmentation():
    nodes = [
        allocation.NodeAllocation("a", NodeTopology(node="a", gpus=_gpus(8)), True, (
            _a("a", (0, 1)), _a("a", (2,), core_pct=30, memory_mib=4096), _a("a", (3,), mig_profile="1g.5gb"))),
        allocation.NodeAllocation("b", NodeTopology(node="b", gpus=_gpus(8)), True, ()),
        allocation.NodeAllocation("c", NodeTopology(node="c", gpus=_gpus(8)), False, (_a("c", (0,)),)),
    ]
    got = allocation.compute(nodes)
    assert got["phalanx_gpus_allocated"] == [
        ({"node": "a", "model": "V100", "mode": "mig"}, 1.0),
        ({"node": "a", "model": "V100", "mode": "shared"}, 1.0),
        ({"node": "a", "model": "V100", "mode": "whole"}, 2.0),
    ]
    core = {lab["mode"]: v for lab, v in got["phalanx_gpu_core_allocated_percent"]}
    assert core["whole"] == 200 and core["shared"] == 30 and math.isclose(core["mig"], 100 / 7)
    mem = {lab["mode"]: v for lab, v in got["phalanx_gpu_memory_allocated_bytes"]}
    assert mem == {"mig": 5 * 2**30, "shared": 4 * 2**30, "whole": 2 * 16 * 2**30}
    # 4 free GPUs on the partly used node a, 8 on the empty node b; disabled node c does not count.
    assert got["phalanx_cluster_fragmentation_ratio"] == [({"model": "V100"}, 4 / 12)]
    assert got["phalanx_gpus_capacity"] == [({"node": "a", "model": "V100"}, 8.0),
                                            ({"node": "b", "model": "V100"}, 8.0)]


def test_fragmentation_is_zero_when_nothing_is_free():
    full = allocation.NodeAllocation("a", NodeTopology(node="a", gpus=_gpus(2)), True, (_a("a", (0, 1)),))
    assert allocation.compute([full])["phalanx_cluster_fragmentation_ratio"] == [({"model": "V100"}, 0.0)]


def test_prometheus_clients_parser_reads_every_line_the_registry_writes():
    """The page is valid exposition, and ``exposition.samples`` keys read exactly like its lines
    (tests and the stack look samples up by that text), escaped label values included."""
    reg = fresh()
    Counter("x_events_total", "Events.", ["consumer"], registry=reg).inc(3, consumer='say "hi"\\back')
    Gauge("x_nodes", "Nodes.", ["state"], registry=reg).replace([({"state": "fresh"}, 7)])
    Histogram("x_duration_seconds", "D.", ["outcome"], buckets=(0.1, 1.0), registry=reg).observe(0.5, outcome="ok")
    text = reg.render()
    lines = {line.rpartition(" ")[0]: float(line.rpartition(" ")[2]) for line in text.splitlines()
             if line and not line.startswith("#")}
    assert exposition.samples(text) == lines
    assert exposition.value(text, "x_nodes", state="fresh") == 7
    assert exposition.value(text, "x_duration_seconds_count", outcome="ok") == 1
    assert exposition.value(text, "x_nodes", state="stale") is None

"""Which DRA pools and devices reach a node (``phalanx_engine.dra.pools.gather``): relevance of
slices, generations, completeness, invalid pools and the search order, as upstream's
``GatherPools`` (Kubernetes 1.36)."""

from __future__ import annotations

import pytest
from dra_builders import NIC, NVIDIA, counter_set, gpu, mig, nic, on, pool, slice_, term

from phalanx_engine.dra.pools import MAX_MEMO, NodeDevices, gather, selection_matches
from phalanx_proto.dra import CounterUse, Device, NodeSelection
from phalanx_proto.scheduling import NodeSelectorRequirement, NodeSelectorTerm


def cases(*rows: tuple) -> list:
    """Parametrize rows whose first item is the case sentence; the sentence is the test id."""
    return [pytest.param(*row, id=row[0]) for row in rows]


def seen(nd: NodeDevices) -> list[tuple]:
    """Each pool as (name, generation, state, device names): the whole answer, comparable."""
    return [(p.name, p.generation, "incomplete" if p.incomplete else p.invalid or "ok", [c.name for c in p.candidates])
            for p in nd.pools]


LABELS = {"zone": "a", "kubernetes.io/hostname": "n1"}
ALL = NodeSelection(all_nodes=True)
NAMED = NodeSelectorTerm(match_fields=(NodeSelectorRequirement(key="metadata.name", operator="In", values=("n1",)),))


@pytest.mark.parametrize("case,pools,want", cases(
    ("a slice for the node is relevant", [pool(NVIDIA, "n1", slice_("s", gpu(0), nodes=on("n1")))],
     [("gpu.nvidia.com/n1", 0, "ok", ["gpu-0"])]),
    ("a slice for another node is not", [pool(NVIDIA, "n2", slice_("s", gpu(0), nodes=on("n2")))], []),
    ("a slice for all nodes is relevant", [pool(NIC, "fabric", slice_("s", nic(0), nodes=ALL))],
     [("nic.example.com/fabric", 0, "ok", ["nic-0"])]),
    ("a node selector matching a label is relevant",
     [pool(NIC, "zone-a", slice_("s", nic(0), nodes=NodeSelection(node_selector=term(zone="a"))))],
     [("nic.example.com/zone-a", 0, "ok", ["nic-0"])]),
    ("a node selector on another label value is not",
     [pool(NIC, "zone-b", slice_("s", nic(0), nodes=NodeSelection(node_selector=term(zone="b"))))], []),
    ("a node selector on metadata.name matches the node's name",
     [pool(NIC, "named", slice_("s", nic(0), nodes=NodeSelection(node_selector=NAMED)))],
     [("nic.example.com/named", 0, "ok", ["nic-0"])]),
    ("a slice that names no nodes is ignored", [pool(NIC, "odd", slice_("s", nic(0)))], []),
    ("per-device node selection keeps the devices for the node",
     [pool(NIC, "pd", slice_("s", Device(name="a", nodes=on("n2")), Device(name="b", nodes=on("n1")),
                             Device(name="c", nodes=ALL), Device(name="d"), per_device=True))],
     [("nic.example.com/pd", 0, "ok", ["b", "c"])]),
    ("per-device node selection with no device for the node is not relevant",
     [pool(NIC, "pd", slice_("s", Device(name="a", nodes=on("n2")), per_device=True))], []),
    ("the highest generation among relevant slices wins",
     [pool(NVIDIA, "n1", slice_("old", gpu(0), gpu(1), nodes=on("n1"), generation=1),
           slice_("new", gpu(0), nodes=on("n1"), generation=2))],
     [("gpu.nvidia.com/n1", 2, "ok", ["gpu-0"])]),
    ("a pool with fewer slices than it says is incomplete",
     [pool(NVIDIA, "n1", slice_("a", gpu(0), nodes=on("n1"), count=2))],
     [("gpu.nvidia.com/n1", 0, "incomplete", [])]),
    ("a pool is complete with the generation's slices for other nodes",
     [pool(NIC, "multi", slice_("a", nic(0), nodes=on("n1"), count=2), slice_("b", nic(1), nodes=on("n2"), count=2))],
     [("nic.example.com/multi", 0, "ok", ["nic-0"])]),
    ("a newer generation for another node makes an incomplete pool obsolete",
     [pool(NIC, "multi", slice_("a", nic(0), nodes=on("n1"), count=2),
           slice_("b", nic(1), nodes=on("n2"), generation=1, count=2))], []),
    ("a complete pool of an older generation is kept even when a newer one exists for other nodes",
     [pool(NIC, "multi", slice_("a", nic(0), nodes=on("n1")), slice_("b", nic(1), nodes=on("n2"), generation=1))],
     [("nic.example.com/multi", 0, "ok", ["nic-0"])]),
    ("two slices naming the same device make the pool invalid",
     [pool(NVIDIA, "n1", slice_("a", gpu(0), nodes=on("n1"), count=2), slice_("b", gpu(0), nodes=on("n1"), count=2))],
     [("gpu.nvidia.com/n1", 0, "duplicate device name gpu-0", [])]),
    ("two counter sets of one name make the pool invalid",
     [pool(NVIDIA, "n1", slice_("c", counters=[counter_set(0), counter_set(0)], nodes=on("n1"), count=2),
           slice_("d", gpu(0), nodes=on("n1"), count=2))],
     [("gpu.nvidia.com/n1", 0, "duplicate counter set name gpu-0-counter-set", [])]),
    ("a device using an unknown counter set makes the pool invalid",
     [pool(NVIDIA, "n1", slice_("d", gpu(0, counters=True), nodes=on("n1")))],
     [("gpu.nvidia.com/n1", 0, "counter set gpu-0-counter-set not found", [])]),
    ("a device using an unknown counter makes the pool invalid",
     [pool(NVIDIA, "n1", slice_("c", counters=[counter_set(0)], nodes=on("n1"), count=2),
           slice_("d", Device(name="x", consumes_counters=(CounterUse(counter_set="gpu-0-counter-set",
                                                                        counters={"bogus": "1"}),)),
                  nodes=on("n1"), count=2))],
     [("gpu.nvidia.com/n1", 0, "counter bogus not found in counter set gpu-0-counter-set", [])]),
    ("a device for another node using an unknown counter makes the pool invalid too",
     [pool(NVIDIA, "shared", slice_("c", counters=[counter_set(0)], nodes=ALL, count=3),
           slice_("d1", mig(0, "1g.10gb", 0), nodes=on("n1"), count=3),
           slice_("d2", Device(name="x", consumes_counters=(CounterUse(counter_set="nope"),)), nodes=on("n2"),
                  count=3))],
     [("gpu.nvidia.com/shared", 0, "counter set nope not found", [])]),
    ("devices in a counters slice are not allocatable",
     [pool(NVIDIA, "n1", slice_("c", gpu(7), counters=[counter_set(0)], nodes=on("n1"), count=2),
           slice_("d", mig(0, "1g.10gb", 0), nodes=on("n1"), count=2))],
     [("gpu.nvidia.com/n1", 0, "ok", ["gpu-0-mig-1g10gb-0"])]),
    ("a pool gang-coordinator could not read is invalid with its reason",
     [pool(NVIDIA, "n1", slice_("s", gpu(0), nodes=on("n1")), problem="slice s: too many devices")],
     [("gpu.nvidia.com/n1", 0, "slice s: too many devices", [])]),
))
def test_which_pools_reach_the_node(case: str, pools: list, want: list) -> None:
    assert seen(gather(pools, "n1", LABELS)) == want


def test_pools_go_by_driver_and_name_slices_by_name_devices_in_order_binding_pools_last() -> None:
    bound = Device(name="dpu-0", binding_conditions=("example.com/attached",))
    nd = gather([
        pool("b.example.com", "p", slice_("s", Device(name="b0"), nodes=on("n1"))),
        pool("a.example.com", "z", slice_("s", Device(name="z0"), nodes=on("n1"))),
        pool("a.example.com", "bound", slice_("s", bound, nodes=on("n1"))),
        pool("a.example.com", "y", slice_("s2", Device(name="y2"), Device(name="y1"), nodes=on("n1"), count=2),
             slice_("s1", Device(name="y0"), nodes=on("n1"), count=2)),
    ], "n1", LABELS)
    assert [(c.key, c.order) for c in nd.candidates] == [
        (("a.example.com", "y", "y0"), 0), (("a.example.com", "y", "y2"), 1), (("a.example.com", "y", "y1"), 2),
        (("a.example.com", "z", "z0"), 3), (("b.example.com", "p", "b0"), 4), (("a.example.com", "bound", "dpu-0"), 5)]


def test_a_pool_keeps_its_counters_in_nanos() -> None:
    nd = gather([pool(NVIDIA, "n1", slice_("c", counters=[counter_set(0)], nodes=on("n1"), count=2),
                      slice_("d", mig(0, "1g.10gb", 0), nodes=on("n1"), count=2))], "n1")
    counters = nd.pools[0].counters
    assert counters[("gpu-0-counter-set", "memory")] == 80 * 2**30 * 10**9
    assert counters[("gpu-0-counter-set", "memory-slice-3")] == 10**9
    assert len(counters) == 10


def test_a_candidate_knows_its_node_selection_and_counter_use() -> None:
    nd = gather([pool(NVIDIA, "n1", slice_("c", counters=[counter_set(0)], nodes=on("n1"), count=2),
                      slice_("d", mig(0, "2g.20gb", 2), nodes=on("n1"), count=2)),
                 pool(NIC, "zone", slice_("s", nic(0), nodes=NodeSelection(node_selector=term(zone="a"))))],
                "n1", LABELS)
    m, n = nd.candidates
    assert (m.node_name, m.node_local, m.node_selector) == ("n1", True, None)
    assert (n.node_name, n.node_local, n.node_selector) == ("", False, term(zone="a"))
    assert dict(m.consumes) == {("gpu-0-counter-set", "memory"): 20 * 2**30 * 10**9,
                                ("gpu-0-counter-set", "multiprocessors"): 28 * 10**9,
                                ("gpu-0-counter-set", "memory-slice-2"): 10**9,
                                ("gpu-0-counter-set", "memory-slice-3"): 10**9}


@pytest.mark.parametrize("case,nodes,want", cases(
    ("a node name is that node", on("n1"), True),
    ("another node name is not", on("n2"), False),
    ("all nodes is every node", ALL, True),
    ("a selector term on labels", NodeSelection(node_selector=term(zone="a")), True),
    ("an empty selector term matches nothing", NodeSelection(node_selector=NodeSelectorTerm()), False),
    ("nothing said matches nothing", NodeSelection(), False),
))
def test_a_node_selection_against_the_node(case: str, nodes: NodeSelection, want: bool) -> None:
    assert selection_matches(nodes, "n1", LABELS) is want


def test_a_nodes_memo_keeps_the_newest_answers() -> None:
    nd = gather([], "n1")
    for i in range(MAX_MEMO + 2):
        nd.remember(i, i)
    assert (len(nd.memo), min(nd.memo), max(nd.memo)) == (MAX_MEMO, 2, MAX_MEMO + 1)

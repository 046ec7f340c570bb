"""A node's own records are data to check, never a precondition of placement's code
(issue: attacks from inside the permission table, rows 1, 5 and 6).

Table-driven: each adversarial report a node's agent could write under its own key is refused
by the bucket's rule (``phalanx_proto.kvrules.BUCKETS``, at decode or by ``report_problem``) with
a message naming the field and the rule. Then a property test: whatever report passes the
rules, or whatever a plugin makes of it, a node's trouble stays that node's — the engine keeps
placing on the others. And placement's staleness deadlines stay one per node however often, or
how far ahead, a node beats.
"""

from __future__ import annotations

import random
from dataclasses import replace as dc_replace

import msgspec
import pytest
from engine_builders import TOPOLOGIES, node, pod

from phalanx_engine.decide import Cluster, decide
from phalanx_engine.snapshot import Decision, NoFit, Snapshot
from phalanx_engine.status import Code
from phalanx_proto import subjects as S
from phalanx_proto.events import NodeHeartbeat, NodeTopologyReported, encoder
from phalanx_proto.kvrules import BUCKETS, heartbeat_problem
from phalanx_proto.topology import Gpu, Nic, NodeTopology

V100 = msgspec.structs.replace(TOPOLOGIES["V100"], node="n1")
replace = msgspec.structs.replace


def verdict(bucket: str, key: str, raw: bytes) -> str:
    """"" when the bucket's rule accepts the value, else the refusal."""
    rule = BUCKETS[bucket]
    try:
        value = rule.decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return f"undecodable: {e}"
    return rule.problem(key, value)


def report(topo: NodeTopology) -> bytes:
    return encoder.encode(NodeTopologyReported(node="n1", topology=topo))


def without(relations: dict, a: str, b: str) -> dict:
    return {x: {y: r for y, r in row.items() if (x, y) not in ((a, b), (b, a))} for x, row in relations.items()}


BAD_REPORTS = [
    ("a GPU link is missing", replace(V100, relations=without(V100.relations, "GPU0", "GPU1")),
     "topology: relations lack GPU0–GPU1: every pair of devices has a relation"),
    ("two GPUs share a name", replace(V100, gpus=(*V100.gpus[:7], replace(V100.gpus[7], name="GPU0"))),
     "topology: device name(s) 'GPU0' listed twice: each device has its own name"),
    ("a relation is unknown", replace(V100, relations={**V100.relations, "GPU0": {
        **V100.relations["GPU0"], "GPU1": "NV99"}}),
     "topology: relations['GPU0']['GPU1']: unknown relation 'NV99' (NV1..NV18, PIX, PXB, PHB, NODE, SYS)"),
    ("a link differs in its two directions", replace(V100, relations={**V100.relations, "GPU0": {
        **V100.relations["GPU0"], "GPU5": "PIX"}}),
     "topology: relations: GPU0–GPU5 is PIX but GPU5–GPU0 is SYS: the matrix is symmetric"),
    ("a relation names a device the node does not have", replace(V100, relations={**V100.relations, "GPU9": {}}),
     "topology: relations name 'GPU9', which is no GPU or NIC of the node"),
    ("a device is related to itself", replace(V100, relations={**V100.relations, "GPU0": {
        **V100.relations["GPU0"], "GPU0": "NV1"}}),
     "topology: relations['GPU0'] relates the device to itself"),
    ("the report holds another node's topology", replace(V100, node="n2"),
     "the report of node 'n1' holds the topology of 'n2'"),
]


@pytest.mark.parametrize(("case", "topo", "rule"), BAD_REPORTS, ids=[c[0] for c in BAD_REPORTS])
def test_a_topology_report_breaking_a_rule_across_fields_is_refused_naming_it(case, topo, rule):
    assert verdict(S.KV_TOPOLOGY, "n1", report(topo)) == rule


def test_the_real_reports_keep_every_rule():
    for name, topo in TOPOLOGIES.items():
        assert verdict(S.KV_TOPOLOGY, "n1", report(replace(topo, node="n1"))) == "", name


BEYOND_BOUNDS = [
    ("a GPU index of 10^18", replace(V100, gpus=(replace(V100.gpus[0], index=10**18), *V100.gpus[1:])),
     "Expected `int` <= 63 - at `$.topology.gpus[0].index`"),
    ("3,000 NICs", replace(V100, nics=tuple(Nic(name=f"mlx5_{i}") for i in range(3000))),
     "Expected `array` of length <= 64 - at `$.topology.nics`"),
    ("a 400 KB model name", replace(V100, gpus=(replace(V100.gpus[0], model="x" * 400_000), *V100.gpus[1:])),
     "Expected `str` of length <= 256 - at `$.topology.gpus[0].model`"),
    ("a CPU list that is not one", replace(V100, gpus=(replace(V100.gpus[0], cpu_affinity="0-3; rm -rf"),
                                                        *V100.gpus[1:])),
     "Expected `str` matching regex '^[0-9,-]*$' - at `$.topology.gpus[0].cpu_affinity`"),
]


@pytest.mark.parametrize(("case", "topo", "rule"), BEYOND_BOUNDS, ids=[c[0] for c in BEYOND_BOUNDS])
def test_a_topology_report_beyond_a_bound_does_not_decode(case, topo, rule):
    assert verdict(S.KV_TOPOLOGY, "n1", report(topo)) == f"undecodable: {rule}"


@pytest.mark.parametrize(("case", "at", "ok"), [
    ("a beat from now", 1_000_000.0, True),
    ("a beat from the past (it is stale, not invalid)", 1_000_000.0 - 3600, True),
    ("a beat 30 s ahead (clock skew)", 1_000_030.0, True),
    ("a beat 10^9 s ahead", 1_000_000.0 + 1e9, False),
])
def test_a_heartbeat_from_the_future_is_refused(case, at, ok):
    problem = heartbeat_problem(S.token("n1"), NodeHeartbeat(node="n1", at=at), now=1_000_000.0)
    assert (problem == "") == ok, problem
    if not ok:
        assert problem == "at 1001000000 is 1000000000 s ahead of now: a beat is at most 60 s ahead (clock skew)"


def test_a_node_state_string_beyond_the_api_servers_bounds_does_not_decode():
    raw = msgspec.json.encode({"labels": {"a": "v" * 64}})
    assert verdict(S.KV_NODE_STATE, "n1", raw) == \
        "undecodable: Expected `str` of length <= 63 - at `$.labels[...]`"


# --- one node's trouble is that node's alone ---------------------------------------------------

def _evil(rng: random.Random, name: str) -> NodeTopology:
    """A topology that may pass the wire rules or not, shaped to break naive code: links
    missing, relations unknown, duplicate names, odd indices, no GPUs, NICs without links."""
    n = rng.randint(0, 9)
    gpus = [Gpu(index=rng.choice([i, i, rng.randrange(64)]), name=rng.choice([f"GPU{i}", f"GPU{i}", "GPU0", ""]),
                memory_mib=rng.choice([0, 16384, 1 << 20]), mig_enabled=rng.random() < 0.2,
                cpu_affinity=rng.choice(["", "0-7", "99999999-1"]), numa=rng.choice([-1, 0, 1]))
            for i in range(n)]
    nics = [Nic(name=rng.choice(["mlx5_0", "mlx5_1", "GPU0"])) for _ in range(rng.randint(0, 2))]
    names = [d.name for d in (*gpus, *nics)]
    relations = {a: {b: rng.choice(["NV1", "NV2", "SYS", "PIX", "NV99", "X", ""]) for b in names
                     if b != a and rng.random() < 0.9} for a in names if rng.random() < 0.95}
    return NodeTopology(node=name, gpus=tuple(gpus), nics=tuple(nics), relations=relations,
                        nvswitch=rng.random() < 0.2)


@pytest.mark.parametrize("seed", range(300))
def test_no_report_of_one_node_stops_placement_on_the_others(seed):
    """Whatever one node reports — checked or not by the wire rules — the good node still gets
    the pod: a plugin raising on the bad node refuses that node alone."""
    rng = random.Random(seed)
    bad = dc_replace(node("bad").gpus(8).view(), topology=_evil(rng, "bad"))
    good = node("good").gpus(8).busy(*range(rng.randint(0, 6))).view()
    members = rng.choice([(pod("p").gpus(1).spec(),), (pod("p").gpus(2).spec(),), (pod("p").share(core=50, memory_mib=1024).spec(),),
                          (pod("p").gpus(1).rdma().spec(),), (pod("a").gpus(1).spec(), pod("b").gpus(1).spec())])
    got = decide(Cluster.from_snapshot(Snapshot(nodes=(bad, good))), members)
    if isinstance(got, NoFit):  # only when the good node itself cannot hold them
        assert decide(Cluster.from_snapshot(Snapshot(nodes=(good,))), members).__class__ is NoFit
    else:
        assert isinstance(got, Decision)
        assert all(a.node in ("good", "bad") for a in got.assignments)


def test_a_node_a_plugin_raises_on_is_refused_alone_with_the_error_named():
    broken = dc_replace(node("broken").gpus(8).view(),
                        topology=replace(V100, node="broken", relations=without(V100.relations, "GPU0", "GPU1")))
    good = node("good").gpus(8).busy(*range(8)).view()
    got = decide(Cluster.from_snapshot(Snapshot(nodes=(broken, good))), (pod("p").gpus(2).spec(),))
    assert isinstance(got, NoFit)
    status = got.failures[0].statuses["broken"]
    assert (status.code, status.resolvable, status.reasons[0].text) == (
        Code.NODE_ERROR, False, "node could not be evaluated")
    assert "KeyError" in status.reasons[0].detail
    # the decision returns the error with its node (placement logs and counts it), and the next
    # decision, on the good node alone, carries none of it
    assert [(n, e.split(":")[0]) for n, e in got.node_errors] == [("broken", "KeyError")]
    assert decide(Cluster.from_snapshot(Snapshot(nodes=(good,))), (pod("p").gpus(2).spec(),)).node_errors == ()


def test_an_invalid_node_takes_nothing_and_says_why():
    invalid = dc_replace(node("n1").gpus(8).view(), invalid="phx-topology (revision 3): topology: relations lack "
                                                             "GPU0–GPU1: every pair of devices has a relation")
    got = decide(Cluster.from_snapshot(Snapshot(nodes=(invalid,))), (pod("p").gpus(1).spec(),))
    assert isinstance(got, NoFit)
    assert got.summary == "0/1 nodes are available: 1 node report invalid."
    assert got.failures[0].statuses["n1"].reasons[0].detail.startswith("phx-topology (revision 3)")

"""The first-fit baseline sees the same reservations as the engine it is compared with."""

from __future__ import annotations

from pathlib import Path

import msgspec

from phalanx_bench.firstfit import free_gpus, place_first_fit
from phalanx_engine.snapshot import Decision, NodeView, NoFit, Snapshot
from phalanx_proto.events import Assignment, MemberSpec, PodRef
from phalanx_topology import load_file

V100 = load_file(Path(__file__).resolve().parents[1] / "fixtures" / "topology"
                 / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt", node="x")


def node(name: str, *reservations: Assignment) -> NodeView:
    return NodeView(name=name, topology=msgspec.structs.replace(V100, node=name), allocations=reservations)


def held(node_name: str, *gpus: int, **share) -> Assignment:
    return Assignment(pod=PodRef(namespace="bg", name=f"bg-{node_name}-{gpus}"), node=node_name, gpus=gpus, **share)


def ask(name: str, gpus: int) -> MemberSpec:
    return MemberSpec(pod=PodRef(namespace="bench", name=name), gpus=gpus)


def test_first_fit_skips_gpus_that_are_reserved_whole_or_shared():
    snap = Snapshot(nodes=(node("a", held("a", 0, 3, 4), held("a", 5, core_pct=10)),))
    got = place_first_fit(snap, (ask("p", 4),))
    assert got == Decision(assignments=(Assignment(pod=ask("p", 4).pod, node="a", gpus=(1, 2, 6, 7),
                                                  gpu_uuids=("",) * 4),))


def test_first_fit_on_a_fully_reserved_cluster_places_nothing():
    snap = Snapshot(nodes=(node("a", held("a", *range(8))), node("b", held("b", *range(6)))))
    got = place_first_fit(snap, (ask("p", 8),))
    assert isinstance(got, NoFit) and got.summary == "0/2 nodes are available: 2 insufficient free GPUs."


def test_the_precomputed_free_map_gives_the_same_answer_and_is_not_changed():
    snap = Snapshot(nodes=(node("a", held("a", 0)), node("b")))
    free = free_gpus(snap)
    before = dict(free)
    gang = (ask("w0", 4), ask("w1", 4), ask("w2", 4))
    assert place_first_fit(snap, gang, free) == place_first_fit(snap, gang)
    assert free == before == {"a": (1, 2, 3, 4, 5, 6, 7), "b": tuple(range(8))}

"""Intra-node GPU choice (R6) on every topology fixture, and ``phalanx place``."""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path

import pytest

from phalanx_cli.main import main
from phalanx_engine.gpuset import GpuChoice, GpuSetScore, NoChoice, choose_gpus, ranked_sets, score_set
from phalanx_proto.topology import Gpu, NodeTopology
from phalanx_topology import load_file
from phalanx_topology.links import link_rank


def cases(*rows: tuple) -> list:
    """Parametrize rows whose first item is the case sentence; the sentence is the test id."""
    return [pytest.param(*row, id=row[0]) for row in rows]


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
V100 = "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
H100 = "aws-p5.48xlarge_8xH100_NV18.txt"
B200 = "gcp-a4-highgpu-8g_8xB200_NV18_8xmlx5_dranet.txt"
A100 = "hgx-a100_8x_NV12_1xmlx5_epyc7763_pleiades.txt"
L40S = "pcie-8xL40S_node-sys_nccl-tests-issue273.txt"
RTX4090 = "pcie-8xRTX4090_allSYS_go-gpuallocator-issue17.txt"
ALL = frozenset(range(8))

_NODES: dict[str, NodeTopology] = {}


def node(fixture: str) -> NodeTopology:
    if fixture not in _NODES:
        _NODES[fixture] = load_file(FIXTURES / fixture)
    return _NODES[fixture]


def uniform(n: int, relation: str, *, nvswitch: bool, numa_of=lambda i: 0) -> NodeTopology:
    """A synthetic node whose GPU pairs are all ``relation``."""
    names = [f"GPU{i}" for i in range(n)]
    return NodeTopology(node=f"synthetic-{n}", nvswitch=nvswitch,
                        gpus=tuple(Gpu(index=i, name=names[i], numa=numa_of(i)) for i in range(n)),
                        relations={a: {b: relation for b in names if b != a} for a in names})


CHOICES = [
    # (sentence, fixture, free, count, require, gpus, ring bottleneck)
    ("on the V100 cube mesh 4 GPUs from an empty node are the NVLink quad 0-3", V100, ALL, 4, (), (0, 1, 2, 3), "NV1"),
    ("on the V100 cube mesh 2 GPUs are a double-NVLink pair", V100, ALL, 2, (), (0, 3), "NV2"),
    ("on the V100 cube mesh 3 GPUs are an NVLink triangle with two NV2 links", V100, ALL, 3, (), (0, 2, 3), "NV1"),
    ("on the V100 cube mesh all 8 GPUs ring over NV2 links only", V100, ALL, 8, (), tuple(range(8)), "NV2"),
    ("on the V100 cube mesh a broken first quad sends 4 GPUs to the second", V100, {0, 2, 3, 4, 5, 6, 7}, 4, (),
     (4, 5, 6, 7), "NV1"),
    ("on the V100 cube mesh a pair leaves the other quad whole", V100, ALL - {0}, 2, (), (2, 3), "NV2"),
    ("on the V100 cube mesh a required GPU gets its same-socket NV2 partner", V100, ALL, 2, (4,), (4, 7), "NV2"),
    ("on the V100 cube mesh the leftover decides between NV2 pairs", V100, {3, 4, 5, 6, 7}, 2, (), (5, 6), "NV2"),
    ("on the all-SYS RTX 4090 node a pair stays on one NUMA node", RTX4090, ALL, 2, (), (0, 1), "SYS"),
    ("on the all-SYS RTX 4090 node 4 GPUs are one NUMA half", RTX4090, ALL, 4, (), (0, 1, 2, 3), "SYS"),
    ("on the all-SYS RTX 4090 node a pair leaves the other NUMA half whole", RTX4090, ALL - {0, 1}, 2, (), (2, 3),
     "SYS"),
    ("on the L40S PCIe node a pair is NODE-linked on one socket", L40S, ALL, 2, (), (0, 1), "NODE"),
    ("on the L40S PCIe node 4 GPUs ring over NODE links", L40S, ALL, 4, (), (0, 1, 2, 3), "NODE"),
    ("on the L40S PCIe node a broken first half sends 4 GPUs to the second", L40S, ALL - {1}, 4, (), (4, 5, 6, 7),
     "NODE"),
    ("on the L40S PCIe node 5 GPUs keep four on one socket", L40S, ALL, 5, (), (0, 1, 2, 3, 4), "SYS"),
    ("on the NVSwitch H100 node the lowest indices win", H100, ALL, 4, (), (0, 1, 2, 3), "NVSWITCH"),
    ("on the NVSwitch H100 node NUMA breaks the tie when the first half is broken", H100, ALL - {0, 1}, 4, (),
     (4, 5, 6, 7), "NVSWITCH"),
    ("on the NVSwitch H100 node a pair keeps the other NUMA half whole", H100, ALL - {0}, 2, (), (1, 2), "NVSWITCH"),
    ("on the NVSwitch B200 node 8 GPUs take the whole fabric", B200, ALL, 8, (), tuple(range(8)), "NVSWITCH"),
    ("on the NVSwitch A100 node a pair shares a NUMA node", A100, ALL - {0}, 2, (), (2, 3), "NVSWITCH"),
    ("one GPU has no ring and takes the lowest index", V100, ALL, 1, (), (0,), ""),
]


@pytest.mark.parametrize(("case", "fixture", "free", "count", "require", "gpus", "link"), CHOICES,
                         ids=[c[0] for c in CHOICES])
def test_gpuset_chooses_the_best_connected_set(case: str, fixture: str, free: set[int], count: int,
                                               require: tuple[int, ...], gpus: tuple[int, ...], link: str) -> None:
    choice = choose_gpus(node(fixture), set(free), count, set(require))
    assert isinstance(choice, GpuChoice)
    assert (choice.gpus, choice.score.ring_link, choice.exact) == (gpus, link, True)


def test_gpuset_v100_quad_is_the_whole_expected_value() -> None:
    assert choose_gpus(node(V100), ALL, 4) == GpuChoice(
        gpus=(0, 1, 2, 3), ring=(0, 1, 2, 3), exact=True,
        score=GpuSetScore(ring_link="NV1", pair_nvlinks=9, pair_class_sum=30, pair_same_numa=6,
                          leftover_nvlinks=9, leftover_class_sum=30, leftover_same_numa=6))


@pytest.mark.parametrize(("case", "fixture", "counts", "expected"), cases(
    ("on the V100 cube mesh 1,1,2,4 keeps the second quad intact", V100, (1, 1, 2, 4),
     [(0,), (3,), (1, 2), (4, 5, 6, 7)]),
    ("on the V100 cube mesh 2,2,4 fills one quad before touching the other", V100, (2, 2, 4),
     [(0, 3), (1, 2), (4, 5, 6, 7)]),
    ("on the V100 cube mesh 4,4 gives both quads", V100, (4, 4), [(0, 1, 2, 3), (4, 5, 6, 7)]),
    ("on the V100 cube mesh 1,2,1,4 still ends with a whole quad", V100, (1, 2, 1, 4),
     [(0,), (2, 3), (1,), (4, 5, 6, 7)]),
    ("on the L40S PCIe node 2,2,4 fills one socket first", L40S, (2, 2, 4), [(0, 1), (2, 3), (4, 5, 6, 7)]),
    ("on the NVSwitch H100 node 1,1,1,1,4 fills one NUMA half first", H100, (1, 1, 1, 1, 4),
     [(0,), (1,), (2,), (3,), (4, 5, 6, 7)]),
))
def test_gpuset_sequential_allocation_keeps_groups_intact(case: str, fixture: str, counts: tuple[int, ...],
                                                          expected: list[tuple[int, ...]]) -> None:
    free = set(ALL)
    got = []
    for k in counts:
        choice = choose_gpus(node(fixture), free, k)
        assert isinstance(choice, GpuChoice)
        got.append(choice.gpus)
        free -= set(choice.gpus)
    assert got == expected


@pytest.mark.parametrize(("case", "free", "count", "require", "expected"), cases(
    ("more GPUs than are free do not fit", {0, 1, 2, 3}, 5, (),
     NoChoice(code="not-enough-free-gpus", reasons=("5 GPUs asked, 4 free",))),
    ("a required GPU that is busy does not fit", {0, 1, 2}, 2, (3,),
     NoChoice(code="required-gpu-not-free", reasons=("required GPUs [3] are not free",))),
    ("more required GPUs than asked for do not fit", ALL, 1, (0, 1),
     NoChoice(code="too-many-required", reasons=("2 GPUs required but only 1 asked for",))),
))
def test_gpuset_no_fit_says_why(case: str, free: set[int], count: int, require: tuple[int, ...],
                                expected: NoChoice) -> None:
    assert choose_gpus(node(V100), set(free), count, set(require)) == expected


def test_gpuset_caller_bugs_raise() -> None:
    with pytest.raises(ValueError, match="count must be at least 1"):
        choose_gpus(node(V100), ALL, 0)
    with pytest.raises(ValueError, match="GPU index 8 is not on this node"):
        choose_gpus(node(V100), ALL | {8}, 2)


def test_gpuset_eligible_limits_the_set_but_leftover_counts_every_free_gpu() -> None:
    choice = choose_gpus(node(V100), ALL, 2, eligible={0, 1, 2, 3})
    assert isinstance(choice, GpuChoice) and choice.gpus == (0, 3)
    assert choose_gpus(node(V100), ALL, 3, eligible={6, 7}) == NoChoice(
        code="not-enough-free-gpus", reasons=("3 GPUs asked, 2 free and eligible",))


def test_gpuset_answers_are_deterministic_and_cached() -> None:
    topo = node(V100)
    first = choose_gpus(topo, {7, 6, 5, 4, 3}, 2)
    assert choose_gpus(topo, frozenset({3, 4, 5, 6, 7}), 2) is first


def test_gpuset_score_set_explains_a_worse_quad() -> None:
    # 0-3-7-4 is an NVLink ring too, but two of its pairs are SYS: fewer NVLinks than quad 0-3.
    assert score_set(node(V100), [0, 3, 4, 7]) == GpuSetScore(
        ring_link="NV1", pair_nvlinks=7, pair_class_sum=20, pair_same_numa=2,
        leftover_nvlinks=0, leftover_class_sum=0, leftover_same_numa=0)


def _brute_bottleneck(topo: NodeTopology, gpus: tuple[int, ...]) -> tuple[int, int]:
    names = {g.index: g.name for g in topo.gpus}

    def rank(a: int, b: int) -> tuple[int, int]:
        return link_rank(topo.relation(names[a], names[b]), nvswitch=topo.nvswitch)

    first, rest = gpus[0], gpus[1:]
    return max(min(rank(a, b) for a, b in zip((first, *p), (*p, first), strict=True))
               for p in itertools.permutations(rest))


@pytest.mark.parametrize("fixture", [V100, L40S, RTX4090, A100])
@pytest.mark.parametrize("count", [3, 4, 5, 6])
def test_gpuset_ring_bottleneck_matches_brute_force_over_all_sets(fixture: str, count: int) -> None:
    topo = node(fixture)
    best = max(_brute_bottleneck(topo, s) for s in itertools.combinations(range(8), count))
    choice = choose_gpus(topo, ALL, count)
    assert isinstance(choice, GpuChoice)
    assert _brute_bottleneck(topo, choice.gpus) == best
    ring = choice.ring
    assert sorted(ring) == list(choice.gpus)
    names = {g.index: g.name for g in topo.gpus}
    assert min(link_rank(topo.relation(names[a], names[b]), nvswitch=topo.nvswitch)
               for a, b in zip(ring, (*ring[1:], ring[0]), strict=True)) == best


def _two_cube_meshes() -> NodeTopology:
    """16 GPUs: two V100 cube meshes, SYS between them."""
    v = node(V100)
    names = [f"GPU{i}" for i in range(16)]
    rel: dict[str, dict[str, str]] = {a: {} for a in names}
    for a, b in itertools.permutations(range(16), 2):
        same = a // 8 == b // 8
        rel[names[a]][names[b]] = v.relation(f"GPU{a % 8}", f"GPU{b % 8}") if same else "SYS"
    return NodeTopology(node="v100x16", relations=rel,
                        gpus=tuple(Gpu(index=i, name=names[i], numa=i // 4) for i in range(16)))


def test_gpuset_exact_search_on_a_16_gpu_node_is_fast() -> None:
    topo = _two_cube_meshes()
    start = time.perf_counter()
    choice = choose_gpus(topo, set(range(16)), 8)
    elapsed = time.perf_counter() - start
    assert isinstance(choice, GpuChoice)
    assert (choice.gpus, choice.score.ring_link, choice.exact) == (tuple(range(8)), "NV2", True)
    assert elapsed < 5


def test_gpuset_beyond_the_exact_bound_falls_back_to_greedy_and_says_so() -> None:
    topo = uniform(32, "NV18", nvswitch=True, numa_of=lambda i: i // 16)
    choice = choose_gpus(topo, set(range(32)), 16)
    assert isinstance(choice, GpuChoice)
    assert (choice.gpus, choice.exact) == (tuple(range(16)), False)


def _key(topo: NodeTopology, gpus: tuple[int, ...], free: set[int]) -> tuple:
    """The objective as a comparable tuple (larger is better), from ``score_set``."""
    ranks = {"": 1 << 30}
    s = score_set(topo, gpus, free)
    link = ranks.get(s.ring_link)
    if link is None:
        nv = s.ring_link.removeprefix("NV")
        link = link_rank("NV18" if nv == "SWITCH" else s.ring_link, nvswitch=topo.nvswitch)
    return (link, s.pair_nvlinks, s.pair_class_sum, s.pair_same_numa,
            s.leftover_nvlinks, s.leftover_class_sum, s.leftover_same_numa)


@pytest.mark.parametrize("case,fixture,free,count", cases(
    ("every quad of the V100 node, best first", V100, ALL, 4),
    ("every pair of the V100 node with GPU 0 busy, best first", V100, ALL - {0}, 2),
    ("every triple of the A100 node, best first", A100, ALL, 3),
))
def test_gpuset_ranked_sets_are_every_set_best_first(case: str, fixture: str, free: set[int], count: int) -> None:
    topo = node(fixture)
    ranked = list(ranked_sets(topo, free, count))
    choice = choose_gpus(topo, free, count)
    assert isinstance(choice, GpuChoice)
    assert ranked[0] == choice.gpus
    assert sorted(ranked) == sorted(itertools.combinations(sorted(free), count))
    keys = [_key(topo, g, free) for g in ranked]
    assert keys == sorted(keys, reverse=True)


def test_gpuset_ranked_sets_on_the_v100_node_start_with_the_two_quads() -> None:
    assert list(ranked_sets(node(V100), ALL, 4))[:2] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_gpuset_ranked_sets_beyond_the_exact_bound_still_yield_every_set_once() -> None:
    topo = uniform(32, "NV18", nvswitch=True, numa_of=lambda i: i // 16)
    ranked = list(ranked_sets(topo, set(range(32)), 4))
    assert (ranked[0], len(ranked), len(set(ranked))) == ((0, 1, 2, 3), math.comb(32, 4), math.comb(32, 4))


def test_gpuset_ranked_sets_of_too_few_free_gpus_are_none() -> None:
    assert list(ranked_sets(node(V100), {0, 1}, 3)) == []


# --- phalanx place ----------------------------------------------------------------------------


def test_place_prints_the_chosen_indices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", "--topology", str(FIXTURES / V100), "--count", "4"]) == 0
    assert capsys.readouterr().out == "0,1,2,3\n"


def test_place_json_has_gpus_ring_and_score(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", "--topology", str(FIXTURES / V100), "--free", "1-7", "--count", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["gpus"], doc["ring"], doc["exact"], doc["score"]["ring_link"]) == ([2, 3], [2, 3], True, "NV2")


def test_place_with_rdma_names_nics_and_level(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", "--topology", str(FIXTURES / V100), "--count", "2", "--rdma"]) == 0
    assert capsys.readouterr().out == "2,3\nnics mlx5_0 level pcie-switch\n"


def test_place_exits_1_with_the_reason_when_nothing_fits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", "--topology", str(FIXTURES / V100), "--free", "0,1", "--count", "3"]) == 1
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", "phalanx place: no fit on dgx1v-like_8xV100-SXM2_mlx5_oneflow "
                                      "(not-enough-free-gpus): 3 GPUs asked, 2 free\n")


@pytest.mark.parametrize(("case", "argv"), cases(
    ("a missing topology file", ["--topology", "/nonexistent/topo.txt", "--count", "1"]),
    ("a GPU the node does not have", ["--topology", str(FIXTURES / V100), "--free", "0-9", "--count", "1"]),
))
def test_place_exits_2_for_bad_input(case: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", *argv]) == 2
    assert capsys.readouterr().err.startswith("phalanx place: ")


def test_place_exits_2_for_a_bad_index_list() -> None:
    with pytest.raises(SystemExit) as info:
        main(["place", "--topology", str(FIXTURES / V100), "--free", "0,x", "--count", "1"])
    assert info.value.code == 2

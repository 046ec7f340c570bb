"""The DRA agreement table against kube-scheduler (issue 38): the same ResourceClaims given to
kube-scheduler and to Phalanx on one real API server (twin pools of DGX-1V-shaped kwok nodes
with NVIDIA-shaped ResourceSlices; tests/kube/draagreement.py says how). For every single-pod
case both must schedule the pod or both leave it pending, every allocation must keep the rules
(counts, constraints, taints, devices other claims hold), and when both schedule it Phalanx's
GPUs must be at least as well connected as kube-scheduler's (``phalanx_engine.gpuset``'s own
ranking of a set: ring bottleneck, then NVLinks over its pairs). Then three gangs pinned to one
node, run on both, each side asserted for what it does: two members of 4 GPUs (the node's two
halves); the same two preferring the whole node (kubernetes#138765: allocating pod by pod, the
first takes all 8); and a trainer whose first-fit GPUs leave its feeder no GPU on the NIC's PCIe
root (kube-scheduler never revisits a placed member's devices).

The kube-scheduler half (``test_kube_scheduler_*``) asserts what kube-scheduler 1.36 does with
each case; the Phalanx half (``test_phalanx_*``) needs Phalanx's DRA support (issue 38).
``test_the_agreement_table`` prints the table; ``bench/dra_agreement.py`` writes it to
docs/dra-agreement.md.
"""

from __future__ import annotations

import pytest
from draagreement import (
    CASES,
    PHALANX,
    QUADS,
    UPSTREAM,
    Case,
    Cluster,
    Row,
    clear_namespace,
    gang_lines,
    make_cluster,
    reasons,
    remove_cluster,
    run_cases,
    run_gang_backtrack,
    run_gang_halves,
    score_key,
    start_phalanx,
    table,
)
from kubeharness import ControlPlane

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(kube_controller_manager: ControlPlane, tmp_path_factory):
    """Twin pools with slices, kube-scheduler (started here unless it runs already) and the
    Phalanx stack serving the Phalanx pool."""
    plane = kube_controller_manager
    p = plane.procs.get("kube-scheduler")
    started = p is None or p.poll() is not None
    plane.start_scheduler()
    c = make_cluster(plane)
    try:
        start_phalanx(c, tmp_path_factory.mktemp("dra-agreement"))
        yield c
    finally:
        if c.stack is not None:
            c.stack.stop()
        for lane in c.lanes:
            clear_namespace(c.api, lane.namespace)
        remove_cluster(c)
        if started:
            plane.stop_scheduler()


@pytest.fixture(scope="module")
def rows() -> dict[str, Row]:
    """Each case runs once (both schedulers at once); both halves read its row."""
    return {}


def row(cluster: Cluster, rows: dict[str, Row], case: Case) -> Row:
    """The case's row; the first call runs every case, in the cluster's lanes at once."""
    if not rows:
        rows.update({r.case.slug: r for r in run_cases(cluster, CASES)})
    return rows[case.slug]


def dump(cluster: Cluster) -> str:
    if cluster.stack is None:
        return ""
    return "\n".join(cluster.stack.tail(n, 25) for n in ("gang-coordinator", "placement", "binder"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.slug)
def test_kube_scheduler_half(cluster, rows, case: Case):
    r = row(cluster, rows, case)
    up = r.outcomes[UPSTREAM]
    assert up.fits == case.upstream_fits, f"kube-scheduler: fits={up.fits} ({up.message})"
    assert not up.timed_out, up.message
    assert r.problems[UPSTREAM] == []


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.slug)
def test_phalanx_half(cluster, rows, case: Case):
    r = row(cluster, rows, case)
    up, phx = r.outcomes[UPSTREAM], r.outcomes[PHALANX]
    assert phx.fits == up.fits, (f"kube-scheduler {'scheduled' if up.fits else 'left pending'} the pod, Phalanx "
                                 f"{'scheduled' if phx.fits else 'left pending'} it: {phx.message}\n{dump(cluster)}")
    assert r.problems[PHALANX] == []
    if up.fits and up.gpus:
        su, sp = r.scores[UPSTREAM], r.scores[PHALANX]
        assert sp is not None and su is not None
        assert score_key(sp) >= score_key(su), f"Phalanx's {phx.gpus} ({sp}) is worse connected than {up.gpus} ({su})"


def _quad(gpus) -> bool:
    return any(set(gpus) <= q for q in QUADS)


# --- gangs -----------------------------------------------------------------------------------------
def test_kube_scheduler_places_two_4_gpu_members_pod_by_pod(cluster):
    """Two members of 4 GPUs on one node: pod by pod, first fit gives the first GPUs 0-3 and the
    second 4-7, the cube mesh's two quads (kube-scheduler gets this one right by the numbering)."""
    run = run_gang_halves(cluster, UPSTREAM)
    assert sorted(frozenset(o.gpus) for o in run.members.values()) == sorted(QUADS), gang_lines([run])


def test_phalanx_places_two_4_gpu_members_on_the_two_nvlink_quads(cluster):
    run = run_gang_halves(cluster, PHALANX)
    members = list(run.members.values())
    assert all(o.fits for o in members), f"{gang_lines([run])}\n{dump(cluster)}"
    assert sorted(frozenset(o.gpus) for o in members) == sorted(QUADS), gang_lines([run])


def test_kube_scheduler_gives_one_member_preferring_the_whole_node_all_of_it(cluster):
    """kubernetes#138765: each claim prefers 8 GPUs; pod by pod, the first takes all 8 and the
    second can never fit (kube-scheduler 1.36 has no gang scheduling by default)."""
    run = run_gang_halves(cluster, UPSTREAM, prefer_whole=True)
    placed = sorted((len(o.gpus), o.fits) for o in run.members.values())
    assert placed == [(0, False), (8, True)], gang_lines([run])


def test_phalanx_gives_two_members_preferring_the_whole_node_a_half_each(cluster):
    run = run_gang_halves(cluster, PHALANX, prefer_whole=True)
    members = list(run.members.values())
    assert all(o.fits for o in members), f"{gang_lines([run])}\n{dump(cluster)}"
    assert sorted(frozenset(o.gpus) for o in members) == sorted(QUADS), gang_lines([run])
    assert all(r["request"] == "gpus/half" for o in members for r in o.results)


def test_kube_scheduler_leaves_the_feeder_without_devices_once_the_trainer_took_gpus_0_to_3(cluster):
    run = run_gang_backtrack(cluster, UPSTREAM)
    trainer, feeder = (run.members[f"ups-{m}"] for m in ("trainer", "feeder"))
    assert trainer.fits and trainer.gpus == (0, 1, 2, 3), gang_lines([run])
    assert not feeder.fits, gang_lines([run])


def test_phalanx_places_trainer_and_feeder_together_each_on_an_nvlink_quad(cluster):
    run = run_gang_backtrack(cluster, PHALANX)
    trainer, feeder = (run.members[f"pha-{m}"] for m in ("trainer", "feeder"))
    assert trainer.fits and feeder.fits, f"{gang_lines([run])}\n{dump(cluster)}"
    assert len(trainer.gpus) == 4 and _quad(trainer.gpus), gang_lines([run])
    assert feeder.gpus == (2, 3) and "nic-0" in feeder.devices, gang_lines([run])
    assert not set(trainer.gpus) & set(feeder.gpus)
    assert trainer.node == feeder.node == cluster.nodes[PHALANX][0]


def test_the_agreement_table(cluster, rows, capsys):
    """Every case's row (running the cases no earlier test ran), printed."""
    done = [row(cluster, rows, c) for c in CASES]
    with capsys.disabled():
        print("\n\nDRA agreement, kube-scheduler (pool upstream) vs Phalanx (pool phalanx), DGX-1V kwok nodes\n")
        print(table(done))
        print("\nWhy pods were left pending:\n" + reasons(done))
    assert len(done) == len(CASES)

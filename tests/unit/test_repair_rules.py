"""Repairing a running gang (libs/phalanx_rules/repair.py and its use in saga.py), table-driven."""

from __future__ import annotations

import msgspec
import pytest

from phalanx_proto.events import MemberSpec, PlacementFailed, PodRef
from phalanx_proto.scheduling import NodeKubeState, Taint, Toleration
from phalanx_proto.state import FailedMember, GangState, Repair, RepairDomain, Running
from phalanx_proto.topology import NetworkTiers
from phalanx_rules import repair, saga

G = "default/Job:train"
PODS = tuple(PodRef(namespace="default", name=f"w-{i}", uid=f"u{i}") for i in range(4))
NEW = tuple(PodRef(namespace="default", name=f"w-{i}-new", uid=f"n{i}") for i in range(4))
BO = dict(base_s=1.0, max_s=60.0)
replace = msgspec.structs.replace
LEAF = RepairDomain(tier="leaf", domain="leaf-a")
NETPOD = RepairDomain(tier="netpod", domain="np-1")


def running(n=4, **kw) -> GangState:
    """A scheduled gang of ``n`` one-GPU members, all bound by attempt 1."""
    return GangState(gang_id=G, phase="scheduled", attempt=1, min_member=n,
                     members=tuple(MemberSpec(pod=p, gpus=1) for p in PODS[:n]), bound=PODS[:n], **kw)


def failed(i: int, node="n1", signal="node_deleted") -> FailedMember:
    return FailedMember(pod=PODS[i], node=node, signal=signal, at=100.0)


def repairing(*lost: int, policy="wait-then-restart", domains=(LEAF, NETPOD), level=0) -> GangState:
    """``running()`` with members ``lost`` failed and gone (dropped), waiting for replacements."""
    s = running()
    for i in lost:
        s = repair.member_failed(s, failed(i, node=f"n{i}"), domains=domains, policy=policy, now=100.0, timeout_s=180)
        s = saga.drop_member(s, PODS[i], f"n{i}")
    return replace(s, repair=replace(s.repair, level=level))


def with_replacements(s: GangState, *idx: int) -> GangState:
    return replace(s, members=s.members + tuple(MemberSpec(pod=NEW[i], gpus=1) for i in idx))


TIERS = {"n1": NetworkTiers(hypernode="h1", leaf="leaf-a", netpod="np-1"),
         "n2": NetworkTiers(hypernode="h2", leaf="leaf-a", netpod="np-1"),
         "n3": NetworkTiers(hypernode="h3", leaf="leaf-b", netpod="np-1"),
         "n4": NetworkTiers(hypernode="h4", leaf="leaf-c", netpod="np-2"),
         "bare": NetworkTiers()}


@pytest.mark.parametrize(("nodes", "expected"), [
    (["n1"], (RepairDomain(tier="node", domain="n1"), RepairDomain(tier="hypernode", domain="h1"), LEAF, NETPOD)),
    (["n1", "n2"], (LEAF, NETPOD)),
    (["n1", "n3"], (NETPOD,)),
    (["n1", "n4"], ()),
    (["n1", "gone"], (RepairDomain(tier="node", domain="n1"), RepairDomain(tier="hypernode", domain="h1"), LEAF,
                      NETPOD)),
    (["bare"], tuple(RepairDomain(tier=t, domain=d) for t, d in (
        ("node", "bare"), ("hypernode", "node:bare"), ("leaf", "node:bare"), ("netpod", "node:bare")))),
    ([], ()),
], ids=["one node: every tier from the node up", "two nodes of one leaf: the leaf, then its network-pod",
        "two leaves of one network-pod: the network-pod", "two network-pods: no common domain",
        "a node whose tiers are unknown (deleted) does not count",
        "a node without tier labels is alone at every tier (the engine's rule)", "no node: nothing"])
def test_the_domains_a_repair_may_use_hold_every_node_of_the_gang_tightest_first(nodes, expected):
    assert repair.gang_domains(nodes, TIERS) == expected


READY = NodeKubeState(ready="True")
NOEXEC = Taint(key="maintenance", effect="NoExecute")
NOSCHED = Taint(key="gpu-check", effect="NoSchedule")


@pytest.mark.parametrize(("kw", "expected"), [
    (dict(state=READY, deleted=False, not_ready_for=0), None),
    (dict(state=None, deleted=True, not_ready_for=0), "node_deleted"),
    (dict(state=NodeKubeState(ready="Unknown"), deleted=False, not_ready_for=29), None),
    (dict(state=NodeKubeState(ready="Unknown"), deleted=False, not_ready_for=30), "node_not_ready"),
    (dict(state=NodeKubeState(ready="True", taints=(NOEXEC,)), deleted=False, not_ready_for=0), "node_tainted"),
    (dict(state=NodeKubeState(ready="True", taints=(NOEXEC,)), deleted=False, not_ready_for=0,
          tolerations=(Toleration(key="maintenance", operator="Exists"),)), None),
    (dict(state=NodeKubeState(ready="True", taints=(NOSCHED,), unschedulable=True), deleted=False,
          not_ready_for=0), None),
    (dict(state=NodeKubeState(ready="True", taints=(NOSCHED,)), deleted=False, not_ready_for=0, no_schedule=True),
     "node_tainted"),
    (dict(state=NodeKubeState(ready="True", unschedulable=True), deleted=False, not_ready_for=0, no_schedule=True),
     "node_cordoned"),
    (dict(state=READY, deleted=False, not_ready_for=0, gpus=(2, 3), unhealthy=(3,)), "gpu_unhealthy"),
    (dict(state=READY, deleted=False, not_ready_for=0, gpus=(2,), unhealthy=(3,)), None),
    (dict(state=None, deleted=False, not_ready_for=0), None),
], ids=["a Ready node: no failure", "the node was deleted", "not Ready within its grace: not yet",
        "not Ready past its grace", "an untolerated NoExecute taint", "a tolerated NoExecute taint",
        "NoSchedule and cordon do not count by default", "an untolerated NoSchedule when configured",
        "a cordon when configured", "a GPU of the member's reported unhealthy",
        "another GPU of the node unhealthy: not this member", "a node whose state is unknown (not deleted)"])
def test_a_member_fails_for_its_node_or_its_gpus(kw, expected):
    state = kw.pop("state")
    got = repair.failure_of(state, **kw)
    assert (got[0] if got else None) == expected


def test_the_first_failure_starts_the_repair_and_a_second_joins_it():
    s = repair.member_failed(running(), failed(1), domains=(LEAF, NETPOD), now=100.0, timeout_s=180)
    assert s.repair == Repair(failed=(failed(1),), domains=(LEAF, NETPOD), started_at=100.0, deadline_at=280.0)
    assert s.phase == "scheduled"
    again = repair.member_failed(s, failed(2, node="n2"), domains=(NETPOD,), now=105.0, timeout_s=180)
    assert again.repair.failed == (failed(1), failed(2, node="n2"))
    assert again.repair.domains == (LEAF, NETPOD) and again.repair.started_at == 100.0  # the first failure's


@pytest.mark.parametrize(("name", "state"), [
    ("a failure seen twice", repair.member_failed(running(), failed(1), now=1, timeout_s=1)),
    ("a pod that is not a bound member", replace(running(), bound=PODS[:1])),
    ("a gang whose attempt runs (not a repair's)", replace(running(), phase="binding")),
    ("a gang that waits", replace(running(), phase="waiting", bound=())),
])
def test_a_failure_that_is_no_running_members_changes_nothing(name, state):
    assert repair.member_failed(state, failed(1), now=2, timeout_s=1) is None


def test_a_survivor_failing_while_the_repair_attempt_runs_joins_the_repair():
    s = saga.start_attempt(with_replacements(repairing(1), 1), now=101, settle_s=2)
    assert s.phase == "placing" and s.repair.attempts == 1
    got = repair.member_failed(s, failed(2, node="n2"), now=102, timeout_s=180)
    assert [f.pod for f in got.repair.failed] == [PODS[1], PODS[2]]


def test_the_repair_attempt_waits_for_every_failed_members_replacement_then_places_them_together():
    two = repairing(1, 2)
    assert two.members == tuple(MemberSpec(pod=p, gpus=1) for p in (PODS[0], PODS[3]))
    assert saga.late_members(with_replacements(two, 1))
    assert saga.start_attempt(with_replacements(two, 1), now=101, settle_s=2) is None  # one of two: wait
    started = saga.start_attempt(with_replacements(two, 1, 2), now=101, settle_s=2)
    assert started.phase == "placing" and started.attempt == 2
    assert [m.pod for m in saga.attempt_members(started)] == [NEW[1], NEW[2]]
    assert {r.pod for r in started.running} == {PODS[0], PODS[3]}  # the survivors keep their GPUs


def test_an_undeclared_gang_needs_a_replacement_per_failed_member():
    s = replace(repairing(1, 2), min_member_declared=False, min_member=2)
    assert saga.start_attempt(with_replacements(s, 1), now=101, settle_s=2) is None
    assert saga.start_attempt(with_replacements(s, 1, 2), now=101, settle_s=2) is not None


def test_the_repair_ends_when_every_replacement_is_bound():
    s = saga.start_attempt(with_replacements(repairing(1), 1), now=101, settle_s=2)
    done = saga.bound(s, 2, (NEW[1],))
    assert done.phase == "scheduled" and done.repair is None and done.home == ()
    assert repair.outcome(s) == "in_domain"


def test_a_failed_member_not_gone_yet_does_not_make_the_gang_complete_by_min_member():
    # 1 and 2 failed; 1 is gone and replaced, 2's pod is not deleted yet: 4 members, but one of
    # them failed, so the replacement alone does not start the repair attempt.
    s = repair.member_failed(with_replacements(repairing(1), 1), failed(2, node="n2"), now=100.5, timeout_s=180)
    assert len(s.members) == s.min_member == 4
    assert saga.start_attempt(s, now=101, settle_s=2) is None
    gone = saga.drop_member(s, PODS[2], "n2")
    assert saga.start_attempt(with_replacements(gone, 2), now=101, settle_s=2).phase == "placing"


def test_the_repair_attempt_waits_until_a_failed_members_pod_is_gone_even_with_its_replacement_present():
    # The race a coordinator restart showed: 1 failed and its replacement arrived before 1's
    # deletion was seen. Placing the replacement then would end the repair with 1 still a held
    # member on its bad node, and the next scan would record 1 as failed again: a repair that
    # waits for a replacement already placed, open for good.
    s = with_replacements(repair.member_failed(running(), failed(1), now=100.0, timeout_s=180), 1)
    assert saga.start_attempt(s, now=101, settle_s=2) is None
    gone = saga.drop_member(s, PODS[1], "n1")
    started = saga.start_attempt(gone, now=101, settle_s=2)
    assert started.phase == "placing" and [m.pod for m in saga.attempt_members(started)] == [NEW[1]]
    done = saga.bound(started, started.attempt, (NEW[1],))
    assert done.repair is None and PODS[1] not in repair.held_members(done)


def test_a_failure_that_joins_a_repair_attempt_under_way_keeps_the_repair_for_its_replacement():
    s = saga.start_attempt(with_replacements(repairing(1), 1), now=101, settle_s=2)
    s = repair.member_failed(s, failed(2, node="n2"), now=102, timeout_s=180)  # a survivor fails meanwhile
    s = saga.drop_member(s, PODS[2], "n2")
    done = saga.bound(s, 2, (NEW[1],))
    assert done.phase == "scheduled" and done.repair is not None  # not over: 2 is not replaced yet
    assert done.repair.replaced == 1 and len(done.repair.failed) == 2 and done.repair.domain() == LEAF
    again = saga.start_attempt(with_replacements(done, 2), now=103, settle_s=2)
    assert again.phase == "placing" and [m.pod for m in saga.attempt_members(again)] == [NEW[2]]
    assert again.repair.domain() == LEAF  # confined as the first one was
    over = saga.bound(again, again.attempt, (NEW[2],))
    assert over.phase == "scheduled" and over.repair is None


def _no_room(s: GangState, now=110.0) -> GangState:
    s = saga.start_attempt(with_replacements(s, 1), now=101, settle_s=2)
    return saga.placement_failed(s, PlacementFailed(gang_id=G, attempt=s.attempt, summary="no room"), now=now, **BO)


@pytest.mark.parametrize(("policy", "level", "restart", "backoff_until"), [
    ("wait-then-restart", 0, False, 111.0),
    ("wait", 0, False, 111.0),
    ("widen", 1, False, 110.0),
    ("restart", 0, True, 111.0),
])
def test_no_room_in_the_domain_is_decided_by_the_gangs_policy(policy, level, restart, backoff_until):
    s = _no_room(repairing(1, policy=policy))
    assert s.phase == "backoff"
    assert (s.repair.level, s.repair.restart) == (level, restart)
    assert s.backoff_until == pytest.approx(backoff_until, abs=0.3)
    assert {r.pod for r in s.running} == {PODS[0], PODS[2], PODS[3]}


def test_widen_goes_one_tier_up_once_and_then_waits():
    s = _no_room(repairing(1, policy="widen"))
    assert s.repair.domain() == NETPOD
    again = saga.placement_failed(saga.start_attempt(replace(s, backoff_until=0), now=111, settle_s=2),
                                  PlacementFailed(gang_id=G, attempt=3, summary="no room"), now=112, **BO)
    assert again.repair.level == 1 and not again.repair.restart


@pytest.mark.parametrize(("policy", "restarts"), [
    ("wait-then-restart", True), ("widen", True), ("wait", False), ("restart", True)])
def test_past_its_deadline_a_waiting_repair_restarts_whole_unless_it_waits_for_good(policy, restarts):
    s = _no_room(repairing(1, policy=policy))
    if s.repair.restart:
        assert repair.overdue(s, 1000.0) is None  # already restarting
        return
    assert repair.overdue(s, 279.0) is None  # before its deadline
    got = repair.overdue(s, 280.0)
    assert (got is not None and got.repair.restart) == restarts


def test_a_repair_attempt_under_way_is_not_overdue_its_own_deadline_decides():
    s = saga.start_attempt(with_replacements(repairing(1), 1), now=101, settle_s=2)
    assert repair.overdue(s, 1000.0) is None


def test_a_restart_deletes_every_member_and_the_gang_waits_to_be_placed_whole_where_it_ran():
    s = repair.restart(with_replacements(repairing(1), 1))
    assert saga.start_attempt(s, now=300, settle_s=2) is None  # no repair attempt while it restarts
    assert repair.restart_pods(s) == (PODS[0], PODS[2], PODS[3], NEW[1])
    for p in (PODS[0], PODS[2], PODS[3]):
        s = saga.drop_member(s, p, "n" + p.name[-1])
    assert s.phase == "waiting" and s.repair is None and s.running == () and s.bound == ()
    assert s.home == ("n1", "n0", "n2", "n3")
    assert [m.pod for m in s.members] == [NEW[1]]


def test_a_tombstone_keeps_where_the_gang_ran_for_its_next_incarnation():
    s = running(2)
    s = saga.drop_member(saga.drop_member(s, PODS[0], "n1"), PODS[1], "n2")
    tomb = saga.tombstone(s)
    assert tomb.home == ("n1", "n2")
    back = saga.add_member(tomb, MemberSpec(pod=NEW[0], gpus=1), gang_id=G, min_member=1, timeout_s=0, priority=0,
                           now=5.0)
    assert back.home == ("n1", "n2")
    assert saga.bound(saga.start_attempt(back, now=6, settle_s=2), 2, (NEW[0],)).home == ()


@pytest.mark.parametrize(("values", "queue", "expected"), [
    ([], "", ("wait-then-restart", "")),
    ([], "widen", ("widen", "")),
    (["restart", ""], "widen", ("restart", "")),
    (["wait", "widen"], "", ("wait", "the gang's pods name different repair policies (wait, widen); using wait")),
    (["sometimes"], "", ("wait-then-restart",
                         "phalanx.io/repair-policy='sometimes' is not one of wait-then-restart, wait, widen, restart")),
], ids=["the default", "the queue's default", "the pods' own policy wins over the queue's",
        "pods that disagree: the first policy in order, and a warning", "a value that is no policy"])
def test_the_policy_comes_from_the_pods_then_the_queue(values, queue, expected):
    assert repair.policy_of(values, queue) == expected


def test_phalanx_explain_line_names_the_failed_members_the_domain_and_the_time_left():
    r = repairing(1).repair
    assert repair.describe(r, 130.0) == ("repairing 1 failed member(s) (w-1 on n1 (node_deleted)) inside leaf "
                                         "leaf-a, policy wait-then-restart, 150s left")


def test_running_members_from_earlier_attempts_count_as_held():
    s = replace(running(2), bound=(PODS[1],), running=(Running(pod=PODS[0], attempt=1),))
    assert repair.held_members(s) == {PODS[0], PODS[1]}


def test_a_member_deleted_while_its_attempt_is_placing_leaves_its_node_where_the_gang_ran():
    """A JobSet pod that fails the moment it is bound, before gang-coordinator has read the binds
    (phase ``placing``): the JobSet controller deletes every pod and makes new ones, and the
    attempt is rolled back; the nodes the reservations put the members on are still where the
    gang ran, so the new pods are placed there first (they went to the other network-pod)."""
    s = replace(running(2), phase="placing", attempt=2, bound=())
    s = saga.drop_member(saga.drop_member(s, PODS[0], "n1"), PODS[1], "n2")
    assert saga.tombstone(s).home == ("n1", "n2")

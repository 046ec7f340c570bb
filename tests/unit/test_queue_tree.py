"""Queues as a tree (libs/phalanx_rules/queues.py), table-driven: the rules a Queue object
alone cannot state, the fair share of each queue (the worked example of docs/queues.md among
the cases), the limit check and the order it gives a cycle; and the queue units of each
request kind."""

from __future__ import annotations

import pytest

from phalanx_proto.events import Assignment, MemberSpec, PodRef
from phalanx_proto.queues import GPU_UNITS, QueueSpec, units_of_assignment, units_of_member
from phalanx_rules.queues import QueueTree, fair_shares, over_limit, rank, tree_problems

G = GPU_UNITS
P = PodRef(namespace="ns", name="p", uid="u")


def q(name, quota=0, limit=None, parent="", weight=1.0, problem="") -> QueueSpec:
    return QueueSpec(name=name, parent=parent, quota=quota * G, limit=None if limit is None else limit * G,
                     over_quota_weight=weight, problem=problem)


@pytest.mark.parametrize(("case", "member", "units"), [
    ("a whole GPU is 700 units", MemberSpec(pod=P, gpus=1), 700),
    ("eight whole GPUs", MemberSpec(pod=P, gpus=8), 5600),
    ("a 3-slice MIG instance is 3/7 of a GPU", MemberSpec(pod=P, mig_slices=3), 300),
    ("a 50 % TDM share is half a GPU", MemberSpec(pod=P, gpus=1, core_pct=50), 350),
    ("a TDM share on two GPUs counts both", MemberSpec(pod=P, gpus=2, core_pct=25), 350),
    ("a share naming only memory still takes 1 %", MemberSpec(pod=P, gpus=1, memory_mib=4096), 7),
    ("a pod without GPUs takes nothing", MemberSpec(pod=P), 0),
])
def test_each_request_kind_is_a_whole_number_of_queue_units(case, member, units):
    assert units_of_member(member) == units


@pytest.mark.parametrize(("case", "assignment", "units"), [
    ("whole GPUs", Assignment(pod=P, node="n", gpus=(0, 1)), 1400),
    ("a MIG instance by its profile", Assignment(pod=P, node="n", gpus=(0,), mig_profile="3g.20gb", mig_start=4), 300),
    ("a TDM share", Assignment(pod=P, node="n", gpus=(3,), core_pct=50, memory_mib=1024), 350),
])
def test_a_reservation_takes_what_its_request_took(case, assignment, units):
    assert units_of_assignment(assignment) == units


PROBLEMS = [
    ("a sound tree has no problem", [q("org", 16), q("a", 8, parent="org"), q("b", 8, 16, parent="org")], {}),
    ("quota above limit", [q("a", 8, 4)], {"a": "spec.resources[nvidia.com/gpu]: quota 8 is above limit 4"}),
    ("an unknown parent", [q("a", parent="ghost")], {"a": "spec.parent: queue 'ghost' does not exist"}),
    ("a cycle", [q("a", parent="b"), q("b", parent="a")],
     {"a": "spec.parent: the parents form a cycle (a -> b -> a)",
      "b": "spec.parent: the parents form a cycle (b -> a -> b)"}),
    ("children's quotas beyond the parent's", [q("org", 8), q("a", 6, parent="org"), q("b", 4, parent="org")],
     {"org": "spec.resources[nvidia.com/gpu].quota 8 is below its children's quotas, 10 (a, b): a child's quota "
             "fits in its parent's"}),
]


@pytest.mark.parametrize(("case", "specs", "problems"), PROBLEMS, ids=[c[0] for c in PROBLEMS])
def test_the_tree_rules_name_the_queue_the_field_and_the_rule(case, specs, problems):
    assert tree_problems(specs) == problems


def shares(specs, demand, capacity):
    got = fair_shares(QueueTree.of(specs), {k: v * G for k, v in demand.items()}, capacity * G)
    return {k: round(v / G, 2) for k, v in got.items() if k != "default" or v}


FAIR = [
    ("each queue gets its quota when it wants it",
     [q("a", 8), q("b", 8)], {"a": 8, "b": 8}, 16, {"a": 8, "b": 8}),
    ("idle quota is lent: a queue wanting more than its quota borrows what another leaves",
     [q("a", 8), q("b", 8)], {"a": 16, "b": 2}, 16, {"a": 14, "b": 2}),
    ("what is left beyond the quotas is split by overQuotaWeight",
     [q("a", 2, weight=3), q("b", 2, weight=1)], {"a": 100, "b": 100}, 16, {"a": 11, "b": 5}),
    ("a limit caps the share, and what it leaves goes to the others",
     [q("a", 2, 4), q("b", 2)], {"a": 100, "b": 100}, 16, {"a": 4, "b": 12}),
    ("the worked example of docs/queues.md: research (24) splits between two teams, prod keeps its 8",
     [q("research", 24), q("team-a", 16, parent="research", weight=1), q("team-b", 8, parent="research", weight=3),
      q("prod", 8)], {"team-a": 10, "team-b": 40, "prod": 4}, 32,
     {"research": 28, "team-a": 10, "team-b": 18, "prod": 4}),
    ("quotas larger than the cluster are scaled down together",
     [q("a", 16), q("b", 16)], {"a": 16, "b": 16}, 16, {"a": 8, "b": 8}),
    ("a queue with a problem gets nothing", [q("a", 8, problem="x"), q("b", 8)], {"a": 8, "b": 8}, 16, {"b": 8}),
]


@pytest.mark.parametrize(("case", "specs", "demand", "capacity", "expected"), FAIR, ids=[c[0] for c in FAIR])
def test_fair_share(case, specs, demand, capacity, expected):
    assert shares(specs, demand, capacity) == expected


def usage(**allocated) -> dict[str, int]:
    return {k: v * G for k, v in allocated.items()}


def test_a_gang_past_its_queues_limit_is_told_how_much_room_there_is():
    tree = QueueTree.of([q("team-a", 8, 16)])
    assert over_limit(tree, "team-a", usage(**{"team-a": 16}), 4 * G) == (
        "0/16 GPUs available to queue team-a: at its limit 16 (allocated 16, this gang needs 4)")
    assert over_limit(tree, "team-a", usage(**{"team-a": 12}), 4 * G) == ""


def test_a_parents_limit_binds_its_children():
    tree = QueueTree.of([q("org", 8, 10), q("a", 4, parent="org"), q("b", 4, parent="org")])
    assert over_limit(tree, "a", usage(org=9, a=5), 2 * G) == (
        "1/10 GPUs available to queue org (a parent of queue a): at its limit 10 (allocated 9, this gang needs 2)")


def test_a_gangs_own_earlier_reservation_given_back_in_the_same_commit_is_not_counted_twice():
    tree = QueueTree.of([q("a", 8, 8)])
    assert over_limit(tree, "a", usage(a=8), 4 * G, releasing={"a": 4 * G}) == ""


def test_the_queue_furthest_below_its_share_comes_first():
    use = usage(a=2, b=8, c=1)
    ranks = {k: rank(k, use, {"a": 8 * G, "b": 8 * G, "c": 0}) for k in ("a", "b", "c", "idle")}
    assert sorted(ranks, key=ranks.get) == ["a", "b", "idle", "c"]


def test_every_gang_belongs_somewhere_the_default_queue_only_borrows():
    tree = QueueTree.of([q("a", 8)])
    assert tree.get("default") == QueueSpec(name="default")
    assert tree.chain("a") == ("a",) and tree.problem("nowhere") == "queue nowhere does not exist"

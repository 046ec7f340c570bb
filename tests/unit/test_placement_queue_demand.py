"""placement's fair shares count a gang's demand while it waits for GPUs, and not once its
reservation is in (it then holds them: counting it again would double its queue's demand).
A gang whose attempt has no MIG stays ``placing`` while it is being bound (docs/saga.md,
"One write fewer"), so "placing" alone does not say it waits."""

from __future__ import annotations

from types import SimpleNamespace

from phalanx_placement.queues import PlacementQueues
from phalanx_proto.events import Assignment, MemberSpec, PodRef
from phalanx_proto.queues import GPU_UNITS, QueueSpec
from phalanx_proto.state import Allocation, GangState, NodeLedger, alloc_key
from phalanx_proto.topology import Gpu, NodeTopology


def member(name: str, queue: str, gpus: int) -> MemberSpec:
    return MemberSpec(pod=PodRef(namespace="ns", name=name, uid=name), gpus=gpus, queue=queue)


def entry(value):
    return SimpleNamespace(value=value)


class Mirror(list):
    revision = 1


class Cache:
    """What ``PlacementQueues.ranks`` reads of placement's cache: one 16-GPU node, two queues,
    the gang records, the ledger, the units each queue holds."""

    def __init__(self, gangs: list[GangState], ledger: NodeLedger, held: dict[str, int]) -> None:
        self.queues = Mirror([entry(QueueSpec(name=q)) for q in ("a", "b")])
        self.gangs = [entry(g) for g in gangs]
        self.queue_units = held
        self._ledger = ledger
        topo = NodeTopology(node="n1", gpus=tuple(Gpu(index=i, name=f"gpu{i}") for i in range(16)))
        self.views = {"n1": SimpleNamespace(topology=topo, enabled=True, invalid=False)}
        self.history: list = []  # no recent usage: the plain fair share
        self.clock = lambda: 0.0

    def gang_keys(self, gang_id: str) -> frozenset[str]:
        return frozenset(k for k, a in self._ledger.allocations.items() if a.gang_id == gang_id)

    def ledger_of(self, key: str) -> NodeLedger | None:
        return self._ledger if key in self._ledger.allocations else None


def shares(gangs: list[GangState], ledger: NodeLedger, held: dict[str, int]) -> dict[str, int]:
    cache = Cache(gangs, ledger, held)
    queues = PlacementQueues(cache, clock=lambda: 100.0)
    queues.ranks()
    return queues.shares


A = member("a-0", "a", 4)
B = [member(f"b-{i}", "b", 4) for i in range(4)]
WAITING_B = GangState(gang_id="ns/b", phase="backoff", attempt=1, members=tuple(B), min_member=4)
PLACING_A = GangState(gang_id="ns/a", phase="placing", attempt=1, members=(A,), min_member=1)
RESERVED = NodeLedger(node="n1", allocations={alloc_key(A.pod): Allocation(
    gang_id="ns/a", attempt=1, assignment=Assignment(pod=A.pod, node="n1", gpus=(0, 1, 2, 3)))})


def test_a_placing_gang_whose_reservation_is_in_counts_what_it_holds_once():
    held = {"a": 4 * GPU_UNITS}
    assert shares([PLACING_A, WAITING_B], RESERVED, held) == shares([WAITING_B], RESERVED, held)


def test_a_placing_gang_without_a_reservation_still_counts_as_demand():
    with_demand = shares([PLACING_A, WAITING_B], NodeLedger(node="n1"), {})
    without = shares([WAITING_B], NodeLedger(node="n1"), {})
    assert with_demand["a"] > without.get("a", 0)

"""gang-coordinator's resync never takes a pod admitted while it was listing for a gone one
(``resync.Resync.once``): a member is gone only when a listing begun after its gang was read
lacks it."""

from __future__ import annotations

import pytest

from phalanx_gang_coordinator.heads import QueueHeads
from phalanx_gang_coordinator.resync import Resync
from phalanx_kube.port import Pod
from phalanx_proto.events import MemberSpec, PodRef
from phalanx_proto.state import GangState

pytestmark = pytest.mark.anyio

FRESH = PodRef(namespace="ns", name="fresh", uid="u-fresh")
OLD = PodRef(namespace="ns", name="old", uid="u-old")


def gang(ref: PodRef) -> GangState:
    return GangState(gang_id=f"{ref.namespace}/{ref.name}", phase="placing", attempt=1,
                     members=(MemberSpec(pod=ref, gpus=1),), updated_at=1e18)


class Store:
    def __init__(self, states: list[GangState]) -> None:
        self.states = states

    async def all(self):
        return list(self.states), []


class Cluster:
    """Lists the pods as they were when the listing began; ``during`` happens meanwhile."""

    def __init__(self, pods: list[Pod], during) -> None:
        self.pods, self.during = pods, during

    async def list_pods(self) -> list[Pod]:
        listed = list(self.pods)
        self.during()
        return listed


class Intake:
    def __init__(self, watched: list[Pod] | None = None) -> None:
        self.deleted: list[str] = []
        self.admitted: list[str] = []
        self.listed = watched is not None
        self.watched = {(p.namespace, p.name): p for p in watched or []}

    async def on_pod(self, pod: Pod) -> None:
        self.admitted.append(f"{pod.namespace}/{pod.name}")

    async def on_pod_deleted(self, pod: Pod, gang_id: str) -> None:
        self.deleted.append(f"{pod.namespace}/{pod.name}")


class Driver:
    def __init__(self) -> None:
        self.announced: set = set()

    def forget_announced(self, running) -> None:
        self.announced &= running

    async def announce(self, state) -> None:
        pass

    async def start(self, gang_id: str) -> None:
        pass

    async def redrive(self, state) -> None:
        pass


HEADS = QueueHeads(starve_after_s=0.0, mode="backfill")


class Config:
    resync_s = 2.0
    full_resync_s = 30.0
    settle_s = 2.0
    redrive_after_s = 5.0
    starve_after_s = 0.0
    fairness = "backfill"
    announce_after_s = 1.0


async def test_a_pod_admitted_while_the_resync_lists_is_not_taken_for_gone_and_a_deleted_one_is():
    store = Store([gang(OLD)])  # "old" was deleted before the listing began
    cluster = Cluster([], during=lambda: store.states.append(gang(FRESH)))  # "fresh" admitted meanwhile
    intake = Intake()
    await Resync(cluster, store, intake, Driver(), Config(), HEADS).once()
    assert intake.deleted == ["ns/old"]


async def test_between_listings_a_tick_takes_the_watchs_view_admits_what_it_missed_and_takes_nobody_for_gone():
    missed = Pod(namespace="ns", name="missed", uid="u-missed")
    store = Store([gang(OLD)])  # "old" is absent from the watch's view: only a listing may say it is gone
    listings = []
    cluster = Cluster([], during=lambda: listings.append("listed"))
    intake = Intake(watched=[missed])
    resync = Resync(cluster, store, intake, Driver(), Config(), HEADS)
    resync._listed_at = float("inf")  # a listing just happened
    await resync.once()
    assert (intake.admitted, intake.deleted, listings) == (["ns/missed"], [], [])
    resync._listed_at = float("-inf")  # full_resync_s has passed since
    await resync.once()
    assert (intake.deleted, listings) == (["ns/old"], ["listed"])

"""gang-coordinator: the orchestrator of the gang saga (docs/saga.md).

It watches pending pods with our scheduler names, groups them into gangs, and drives each
gang through ``waiting → placing → preparing → binding → scheduled``, or through
``rolling_back → backoff → placing`` when an attempt fails or its deadline fires. The parts,
each its own module:

==============  ===========================================================================
``store``       the gang states in KV ``phx-gangs``, compare-and-set only
``intake``      pods in (gang membership, invalid requests told), pods gone
``saga``        the transitions, pure (``phalanx_rules.saga``: the rulebook, shared with ``phalanx sim``)
``effects``     the side effects of a transition as data, pure
``driver``      attempts, replies, deadlines: check, transition, carry the effects out
``compensate``  the rollback's compensations, and undoing a late bind
``notify``      Warning events and ``PodScheduled`` conditions on pods, sent off the saga's
                path (at most one pod's calls in flight each, the latest condition wins)
``drabook``     DeviceClasses, ResourceSlices and ResourceClaims: the pools to KV ``phx-dra``,
                each pod's claims resolved (docs/dra.md)
``podgroups``   the Workload API's PodGroups: a gang's size from its object, its status back
``resync``      the periodic safety net and the queue view; which waiting gang may
                start now is ``phalanx_rules.fairness`` (pure; ``phalanx sim`` runs it too)
``reconciler``  ledger vs gang records vs bound pods, repaired (one replica: ``lease``;
                the comparison itself is ``audit``, pure)
==============  ===========================================================================

Crash safety: state is written before the command that follows from it is published; resync
re-drives a gang that sits in a running phase (or in ``rolling_back``) without progress by
re-publishing the same commands (same ``Nats-Msg-Id``) or re-running the compensations not
yet recorded as done; every downstream handler and every compensation is idempotent. The
attempt deadline is a JetStream scheduled message, so it fires even while this service is
down.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import anyio

from phalanx_bus import BatchSender, Bus, KvMirror, consume, sender_id
from phalanx_gang_coordinator.changes import ClusterChanges, Signal
from phalanx_gang_coordinator.drabook import DraBook
from phalanx_gang_coordinator.driver import SagaDriver
from phalanx_gang_coordinator.heads import QueueHeads
from phalanx_gang_coordinator.intake import PodIntake
from phalanx_gang_coordinator.notify import Notifier
from phalanx_gang_coordinator.podgroups import PodGroupBook
from phalanx_gang_coordinator.queuebook import QueueBook
from phalanx_gang_coordinator.reconciler import Reconciler
from phalanx_gang_coordinator.repairs import RepairWatch
from phalanx_gang_coordinator.resync import Resync
from phalanx_gang_coordinator.store import GangStore
from phalanx_kube.port import ClusterPort
from phalanx_proto import subjects as S
from phalanx_proto.events import BindPods, PlaceRequested, ReleaseRequested, gang_decoder, node_decoder
from phalanx_proto.kubeapi import TIMEOUT_ANNOTATION
from phalanx_rules import fairness as order
from phalanx_service.config import option

DURABLE = "gang-coordinator"
DURABLE_NODE = "gang-coordinator-node"
DURABLE_DEADLINE = "gang-coordinator-deadline"


@dataclass(frozen=True)
class Config:
    """gang-coordinator's configuration: each field is a flag of ``phalanx run gang-coordinator``
    (``phalanx_service.config``), its help the field's meaning."""

    resync_s: float = option(2.0, "seconds between pod re-lists")
    full_resync_s: float = option(30.0, "seconds between resync passes that list the pods from the API server; "
                                  "the passes in between replay the pod watch's view")
    redrive_after_s: float = option(5.0, "re-publish the commands of a gang without progress for this long")
    backoff_base_s: float = option(order.BACKOFF_BASE_S, "first retry delay")
    backoff_max_s: float = option(order.BACKOFF_MAX_S, "largest retry delay")
    unschedulable_retry_s: float = option(order.UNSCHEDULABLE_RETRY_S,
                                          "a gang that fits no node set of the cluster is tried again when a node "
                                          "changes, and after this long at the latest")
    default_timeout_s: float = option(180.0, f"attempt deadline when the pods set no {TIMEOUT_ANNOTATION}")
    settle_s: float = option(2.0, "a gang without min-member starts after no member arrived for this long")
    starve_after_s: float = option(order.STARVE_AFTER_S, "a head-of-line gang waiting this long is protected from starvation; "
                                   "0 turns it off")
    fairness: str = option(order.MODES[0], "how a starving head of the queue is protected: 'backfill' lets later "
                           "gangs run on nodes its placement does not need, 'strict' holds them all back (FIFO)",
                           choices=order.MODES)
    reconcile_s: float = option(5.0, "seconds between reconciler passes (ledger vs gang records vs bound pods; "
                                "one replica at a time holds its lease); 0 runs no reconciler here")
    tombstone_s: float = option(3600.0, "keep the entry of a gang whose pods are all gone this long, so a gang "
                                "recreated under its id never reuses an attempt number")
    parallelism: int = option(16, "replies and pod events handled at once; one gang's one at a time, in order")
    queue_sync_s: float = option(2.0, "seconds between readings of the Queue objects and namespaces "
                                 "(docs/queues.md)")
    repair_scan_s: float = option(1.0, "seconds between looks at the running gangs' nodes and GPUs for failed "
                                  "members (docs/repair.md); 0 looks never (deleted and failed pods still start "
                                  "repairs)")
    repair_not_ready_grace_s: float = option(30.0, "a node seen not Ready this long fails the running gangs' "
                                             "members on it (they are repaired)")
    repair_on_no_schedule: bool = option(False, "an untolerated NoSchedule taint or a cordon fails a running "
                                         "gang's members on the node too (NoExecute always does)")
    announce_after_s: float = option(1.0, "an attempt still running after this long gets its deadline scheduled "
                                     "and gang.admitted published; quicker attempts publish neither (0: every "
                                     "attempt at once)")


@dataclass
class Coordinator:
    """The parts, wired together."""

    store: GangStore
    notifier: Notifier
    driver: SagaDriver
    intake: PodIntake
    resync: Resync
    reconciler: Reconciler
    queues: QueueBook

    changes: ClusterChanges
    dra: DraBook
    repairs: RepairWatch | None = None

    @classmethod
    def build(cls, bus: Bus, cluster: ClusterPort, gangs_kv, config: Config,
              batched: Mapping[type, BatchSender] | None = None) -> Coordinator:
        """The parts, each given its collaborators; ``batched``: command type → the sender that
        batches it (none: every command published alone)."""
        store = GangStore(gangs_kv, KvMirror.of_bucket(bus, S.KV_GANGS))
        notifier = Notifier(cluster)
        changes = ClusterChanges(bus)
        queues = QueueBook(bus, cluster, changes.topology, sync_s=config.queue_sync_s)
        heads = QueueHeads(starve_after_s=config.starve_after_s, mode=config.fairness)
        bound_seen: dict[str, str] = {}
        driver = SagaDriver(bus, cluster, store, notifier, config, queues, gate=heads.gate, bound_seen=bound_seen,
                            batched=batched)
        dra = DraBook(bus, cluster, changed=changes.signal)
        groups = PodGroupBook(cluster)
        driver.groups = groups
        intake = PodIntake(cluster, store, driver, notifier, config.settle_s, parallelism=config.parallelism,
                           queues=queues, bound_seen=bound_seen, dra=dra, groups=groups)
        groups.arrived = intake.take_in_group
        repairs = RepairWatch(store, driver, cluster, notifier, changes, pods=intake.watched,
                              not_ready_grace_s=config.repair_not_ready_grace_s,
                              no_schedule=config.repair_on_no_schedule, queue_default=queues.repair_policy)
        intake.repairs = repairs
        return cls(store, notifier, driver, intake, Resync(cluster, store, intake, driver, config, heads),
                   Reconciler(bus, cluster, store, intake, notifier, reconcile_s=config.reconcile_s, queues=queues),
                   queues, changes, dra, repairs)

    async def wake_on(self, signal: Signal, pick, why: str) -> None:
        """Whenever ``signal`` fires, try again the gangs ``pick`` says wait for it
        (``fairness.woken_by_cluster_change``, ``woken_by_queue_change``)."""
        async for _ in signal.changes():
            states, _ = await self.store.all()
            await self.driver.wake_all(pick(states, now=time.time()), why)


async def run(bus: Bus, cluster: ClusterPort, config: Config, *,
              task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run gang-coordinator until cancelled; ready once its three consumers and the pod watch are live."""
    me = sender_id()
    to_placement = BatchSender(bus, S.placement_batch_subject(me), me)
    to_binder = BatchSender(bus, S.binder_batch_subject(me), me)
    coord = Coordinator.build(bus, cluster, await bus.kv(S.KV_GANGS), config, batched={
        PlaceRequested: to_placement, ReleaseRequested: to_placement, BindPods: to_binder})
    driver = coord.driver
    async with anyio.create_task_group() as tg:
        await tg.start(to_placement.run)
        await tg.start(to_binder.run)
        await tg.start(coord.notifier.run)
        await tg.start(coord.store.run)
        await tg.start(coord.changes.run)
        await tg.start(driver.ledger.run)
        await tg.start(driver.mig.run)
        await tg.start(coord.queues.run)
        await tg.start(coord.dra.run)
        if coord.intake.groups is not None:
            await tg.start(coord.intake.groups.run)
        await tg.start(lambda task_status: consume(
            bus, stream=S.CONSUMER[DURABLE].stream, durable=DURABLE, filter_subject=S.CONSUMER[DURABLE].filter,
            decoder=gang_decoder, handler=driver.on_reply, concurrency=config.parallelism,
            order_key=S.gang_key_of_subject, task_status=task_status))
        await tg.start(lambda task_status: consume(
            bus, stream=S.CONSUMER[DURABLE_NODE].stream, durable=DURABLE_NODE, filter_subject=S.CONSUMER[DURABLE_NODE].filter,
            decoder=node_decoder, handler=driver.on_node_reply, task_status=task_status))
        await tg.start(lambda task_status: consume(
            bus, stream=S.CONSUMER[DURABLE_DEADLINE].stream, durable=DURABLE_DEADLINE, filter_subject=S.CONSUMER[DURABLE_DEADLINE].filter,
            decoder=gang_decoder, handler=driver.on_deadline, task_status=task_status))
        await tg.start(coord.intake.watch)
        tg.start_soon(coord.wake_on, coord.changes.signal, order.woken_by_cluster_change, "the cluster changed")
        tg.start_soon(coord.wake_on, coord.queues.changed, order.woken_by_queue_change, "the queues changed")
        tg.start_soon(coord.resync.run)
        if config.repair_scan_s > 0 and coord.repairs is not None:
            tg.start_soon(coord.repairs.run, config.repair_scan_s)
        if config.reconcile_s > 0:
            tg.start_soon(coord.reconciler.run)
        task_status.started()

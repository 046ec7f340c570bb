"""binder: binds placed pods to their nodes through the Kubernetes port.

For each ``BindPods`` (a gang attempt's members, by reference): for every pod the checks
pass, at the same time, record the pod in its node's fence when the node's agent serves the
device plugin, then the Binding, which carries the assignment annotation (the API server sets
both in one write), then a ``Scheduled`` event; then one ``BindsDone`` reply naming the pods
bound and those that failed, with why. Idempotent: a pod already bound to the same node counts
as bound (a redelivered command after a crash); bound elsewhere or recreated is a failure with
the reason.

**Claims** (``claims.py``, docs/dra.md): the ResourceClaims the reservations hold are written
— allocation and ``reservedFor`` — for all the command's pods before any Binding; one that
cannot be binds none. ``UnreserveClaims`` (a rollback's compensation) takes unbound pods back
out of them.

**The fence** (docs/delivery.md). The annotation is the exact text ``encoder.encode(a)`` of
the assignment, and the fence entry records its SHA-256, so the node's device plugin serves
only what binder wrote. The entry is written before the Binding (the kubelet can admit the
pod as soon as it is bound), through ``NodeFences``: one write per node for the binds under
way together (a gang's pods on a node share one). The entry is released as soon as the pod
has started, turned terminal, or is deleted (``PodWatch``). On the "already bound" path the
entry is written again unless the pod has started, so a crash between the fence and the
Binding, or an entry that lapsed, is repaired by the redelivery.

**The checks** (docs/saga.md, "Checks"). The command names pods only: binder binds each to
the assignment placement recorded in ``phx-ledger`` for exactly this gang, attempt and pod uid
(the ledger is the assignment's one home), a MIG member with the instance its node's
mig-manager recorded ready for it in ``phx-mig``, only a pod whose ``schedulerName`` is
Phalanx's, and only to a node that has a topology report in ``phx-topology`` and is enabled.
The three buckets are mirrored in memory from KV watches (``KvMirror``, ``LedgerBook``), so a
bind reads no KV entry; when a mirror lacks the node, the reservation or the instance, binder
catches it up to everything the bucket held when it asked (a reservation committed a moment
ago is then seen) and checks again. A command that fails a check is
refused: logged with the rule, counted in ``phalanx_refused_messages_total``, acknowledged,
and nothing is written — no reply either, so a forged command cannot make the coordinator give
up a good attempt. A bind of an attempt that was rolled back finds its reservation released and
is refused the same way.

**Concurrency.** Up to ``parallelism`` commands are handled at once (as kube-scheduler binds
asynchronously), each binding all its pods at once; each message is acknowledged on its own
(``consume(concurrency=...)``). The
pod is read from the pod watch's cache when it knows that uid, else from the API server.

**Evictions** (``evictions.py``, docs/preemption.md): ``EvictPods`` from placement, on their
own durable consumer, evict the victims of a preemption through the Eviction API, checked
against the preemptor's nomination and the reservations in the ledger.

Metrics: ``phalanx_pod_pending_to_bound_seconds`` (from the pod's creation time),
``phalanx_binds_total{result}``, ``phalanx_fence_writes_total{result}``,
``phalanx_fence_batch_pods``; span ``binder.bind`` with ``k8s.pod.name``,
``k8s.namespace.name`` and ``k8s.node.name``.
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial

import anyio
import msgspec

from phalanx_binder import claims
from phalanx_binder.evictions import Evictions
from phalanx_binder.fences import NodeFences, Ticket
from phalanx_binder.pods import PodWatch
from phalanx_bus import (
    BatchSender,
    Bus,
    Delivery,
    KvMirror,
    MirrorLagging,
    TemporaryError,
    consume,
    sender_id,
)
from phalanx_bus.ledger import LedgerBook
from phalanx_kube import fence as F
from phalanx_kube.port import BindConflict, ClusterPort, NotOurs, Pod, PodGone
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    Assignment,
    BindFailure,
    BindPods,
    BindsDone,
    EvictPods,
    PodRef,
    UnreserveClaims,
    gang_decoder,
)
from phalanx_proto.kubeapi import (
    ASSIGNMENT_ANNOTATION,
    SCHEDULER_NAMES,
    FenceEntry,
    assignment_digest,
    encode_assignment,
)
from phalanx_proto.state import NodeMig, mig_slot
from phalanx_proto.vocab import RefusalRule as R
from phalanx_service.config import namespace_name, option, whole_number
from phalanx_telemetry import log, metrics, refused, tracer, warn

DURABLE = "binder"
EVICT_DURABLE = "binder-evict"
EVICT_COMMANDS_AT_ONCE = 4
"""Eviction commands binder handles at once (each evicts its victims' pods, ``evictions.EVICT_PODS_AT_ONCE`` at a time)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    rule: R
    """The check the pod failed (``phalanx_proto.vocab.RefusalRule``)."""
    why: str


@dataclass(frozen=True)
class Config:
    """binder's configuration: each field is a flag of ``phalanx run binder`` (``phalanx_service.config``)."""

    parallelism: int = option(16, "bind commands handled at once, as kube-scheduler binds asynchronously; the "
                              "Kubernetes client's --kube-api-qps/--kube-api-burst still pace the requests",
                              env="PHALANX_BIND_PARALLELISM", parse=whole_number(1, 1024))
    fence_namespace: str = option("phalanx-system", "namespace of the per-node fence leases that the node agents' "
                                  "device plugins read (docs/delivery.md)", env="POD_NAMESPACE", parse=namespace_name)
    instance: str = option("", "this replica's name, written as the fence leases' holder (default: $POD_NAME, "
                           "else host name and process id)")


def default_instance() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def node_fenced(topology: KvMirror, node: str) -> bool:
    """The node's agent serves the device plugin (its topology report says so), so binds to it go
    through its fence."""
    entry = topology.get(S.token(node))
    return entry is not None and entry.value.node == node and entry.value.device_plugin


class Binder:
    def __init__(self, bus: Bus, cluster: ClusterPort, *, topology: KvMirror, ledger: LedgerBook,
                 mig: KvMirror[NodeMig], fences: NodeFences, pods: PodWatch | None = None,
                 answers: BatchSender | None = None) -> None:
        self.bus = bus
        me = sender_id()
        self.answers = answers or BatchSender(bus, S.binder_answers_subject(me), me)
        """Where ``BindsDone`` goes: the answers of the binds that end together, as one batch."""
        self.cluster = cluster
        self.topology = topology
        self.ledger = ledger
        self.mig = mig
        self.fences = fences
        self.pods = pods
        self.evictions = Evictions(bus, cluster, ledger)

    async def on_command(self, event, delivery: Delivery) -> None:
        match event:
            case BindPods():
                await self.bind_pods(event)
            case UnreserveClaims():
                await claims.unreserve(self.cluster, event, self._pod)
            case EvictPods():
                await self.evictions.evict(event)
            case _:
                warn("unexpected event on binder subject", kind=type(event).__name__)

    # -- the checks -----------------------------------------------------------------------------
    def fenced(self, node: str) -> bool:
        return node_fenced(self.topology, node)

    def _check(self, ev: BindPods, ref: PodRef) -> Refusal | Assignment:
        """What to bind ``ref`` to: the ledger's reservation for exactly (gang, attempt, pod uid)
        on a known, enabled node, a MIG slice with the instance its node recorded ready for it."""
        alloc = self.ledger.allocation(ref)
        if alloc is None or (alloc.gang_id, alloc.attempt) != (ev.gang_id, ev.attempt):
            held = f"gang {alloc.gang_id} attempt {alloc.attempt}" if alloc is not None else "nothing"
            return Refusal(R.NOT_IN_LEDGER, f"the ledger holds {held} for {ref} (uid {ref.uid or '-'}), not gang "
                                            f"{ev.gang_id} attempt {ev.attempt}")
        a = alloc.assignment
        key = S.token(a.node)
        topo = self.topology.get(key)
        if topo is None or topo.value.node != a.node:
            bad = self.topology.poisoned.get(key)
            return Refusal(R.UNKNOWN_NODE, f"node {a.node!r} has no (readable) topology report in phx-topology"
                                           + (f": {bad.error}" if bad else ""))
        if not topo.value.enabled:
            return Refusal(R.NODE_DISABLED, f"node {a.node} is not enabled for Phalanx")
        if alloc.adopted:
            return Refusal(R.ADOPTED_RESERVATION, f"the ledger's reservation of {ref} on {a.node} was recorded for a "
                                                  "pod found bound there (an adoption), not by a placement decision: "
                                                  "binder binds only what placement decided")
        if a.mig_profile:
            entry = self.mig.get(key)
            record = entry.value.instances.get(mig_slot(a.gpus[0] if a.gpus else 0, max(0, a.mig_start))) \
                if entry is not None else None
            if record is None or record.state != "ready" or not record.owned_by(ev.gang_id, ev.attempt, ref):
                return Refusal(R.MIG_NOT_READY, f"no MIG instance is recorded ready in phx-mig for {ref} at GPU "
                                                f"{a.gpus[0] if a.gpus else 0} slot {a.mig_start} of {a.node}")
            return msgspec.structs.replace(a, mig_instance_uuid=record.uuid)
        return a

    async def checked(self, ev: BindPods) -> dict[PodRef, Refusal | Assignment]:
        """Each pod's verdict, from the mirrors; a pod they know nothing of yet (a reservation
        or instance recorded a moment ago) catches them up to the buckets once, and is checked
        again."""
        verdicts = {ref: self._check(ev, ref) for ref in dict.fromkeys(ev.pods)}
        behind = {v.rule for v in verdicts.values() if isinstance(v, Refusal)} & {
            R.UNKNOWN_NODE, R.NOT_IN_LEDGER, R.MIG_NOT_READY}
        if behind:
            try:
                for rule, mirror in ((R.UNKNOWN_NODE, self.topology), (R.NOT_IN_LEDGER, self.ledger),
                                     (R.MIG_NOT_READY, self.mig)):
                    if rule in behind:
                        await mirror.catch_up()
            except MirrorLagging as e:
                raise TemporaryError(f"cannot check the binds yet: {e}", delay=1.0) from e
            verdicts = {ref: self._check(ev, ref) if isinstance(v, Refusal) else v for ref, v in verdicts.items()}
        return verdicts

    # -- the binds ------------------------------------------------------------------------------
    async def bind_pods(self, ev: BindPods) -> None:
        """Bind every pod the checks pass, all at once (a node's pods share one fence write),
        then answer with what was bound and what failed. A pod that could not be tried now
        (its node's fence is full) makes the command come back once the answer is sent: the
        pods bound meanwhile are then found bound and answered again."""
        verdicts = await self.checked(ev)
        for ref, v in verdicts.items():
            if isinstance(v, Refusal):
                refused(v.rule, v.why, pod=str(ref), gang=ev.gang_id, attempt=ev.attempt)
        todo = [a for a in verdicts.values() if isinstance(a, Assignment)]
        outcomes: dict[PodRef, str] = await claims.reserve(self.cluster, todo) if any(a.claims for a in todo) else {}
        """Pod → "" when bound, else why not."""
        if outcomes:
            todo = []  # a claim could not be reserved: no pod of the gang is bound
        retry: list[TemporaryError] = []
        with ExitStack() as stack:
            # Announced to each node's fence writer at once, so the pods of a node share one write.
            tickets = [stack.enter_context(self.fences.coming(a.node)) if self.fenced(a.node) else None for a in todo]
            async with anyio.create_task_group() as tg:
                for a, ticket in zip(todo, tickets, strict=True):
                    tg.start_soon(self._bind_one, ev, a, ticket, outcomes, retry)
        bound = tuple(ref for ref in verdicts if outcomes.get(ref) == "")
        failed = tuple(BindFailure(pod=ref, reason=outcomes[ref]) for ref in verdicts if outcomes.get(ref))
        if bound or failed:
            await self.answers.send(BindsDone(gang_id=ev.gang_id, attempt=ev.attempt, bound=bound, failed=failed))
        if retry:
            raise retry[0]

    async def _bind_one(self, ev: BindPods, a: Assignment, ticket: Ticket | None, outcomes: dict[PodRef, str],
                        retry: list[TemporaryError]) -> None:
        with tracer().start_as_current_span("binder.bind", attributes={
                "k8s.pod.name": a.pod.name, "k8s.namespace.name": a.pod.namespace, "k8s.node.name": a.node,
                "phalanx.gang": ev.gang_id, "phalanx.attempt": ev.attempt, "phalanx.gpus": list(a.gpus)}) as span:
            try:
                outcome = await self._bind(ev, a, ticket, span)
            except TemporaryError as e:
                retry.append(e)
                return
            finally:
                if ticket is not None:
                    self.fences.done(ticket)
            if outcome is not None:
                outcomes[a.pod] = outcome

    async def _pod(self, ref: PodRef) -> Pod | None:
        cached = self.pods.get(ref) if self.pods is not None else None
        return cached if cached is not None else await self.cluster.get_pod(ref)

    async def _bind(self, ev: BindPods, a: Assignment, ticket: Ticket | None, span) -> str | None:
        """Bind one pod: "" when bound (or found bound there), the reason when it cannot be,
        None when it is refused (not Phalanx's pod)."""
        ref = a.pod
        try:
            pod = await self._pod(ref)
            if pod is None or (ref.uid and pod.uid != ref.uid):
                raise PodGone(f"pod {ref} no longer exists")
            if not _ours(pod):
                refused(R.FOREIGN_SCHEDULER, f"pod {ref} has schedulerName {pod.scheduler_name!r}, not Phalanx's",
                        gang=ev.gang_id, attempt=ev.attempt)
                span.set_attribute("phalanx.outcome", "refused")
                return None
            if pod.node_name and pod.node_name != a.node:
                raise BindConflict(f"pod {ref} is already bound to {pod.node_name}")
            already = pod.node_name == a.node
            settled = already and (pod.started or pod.terminal)  # the container has its devices (or never will)
            text = encode_assignment(a)
            if already and not settled and pod.annotations.get(ASSIGNMENT_ANNOTATION) != text:
                await self.cluster.annotate_pod(ref, {ASSIGNMENT_ANNOTATION: text})
            if not settled and self.fenced(a.node):
                await self._fence(ev, a, text, ticket)
            if already:
                log("already bound", pod=str(ref), node=a.node, gang=ev.gang_id)
                metrics.BINDS.inc(result="already_bound")
                span.set_attribute("phalanx.outcome", "already_bound")
            else:
                await self.cluster.bind(ref, a.node, {ASSIGNMENT_ANNOTATION: text})  # the annotation in the same write
                gpus = ",".join(map(str, a.gpus)) or "-"
                await self.cluster.record_event(
                    ref, reason="Scheduled",
                    message=f"Successfully assigned {ref} to {a.node} (GPUs {gpus}) by phalanx, gang {ev.gang_id} attempt {ev.attempt}")
                log("bound", pod=str(ref), node=a.node, gpus=gpus, gang=ev.gang_id, attempt=ev.attempt)
                metrics.BINDS.inc(result="bound")
                span.set_attribute("phalanx.outcome", "bound")
                if pod.created:
                    metrics.POD_PENDING_TO_BOUND_SECONDS.observe(max(0.0, time.time() - pod.created))
        except (BindConflict, PodGone, NotOurs) as e:
            metrics.BINDS.inc(result="failed")
            span.set_attribute("phalanx.outcome", "failed")
            span.set_attribute("phalanx.failure_reason", str(e))
            return str(e)
        return ""

    async def _fence(self, ev: BindPods, a: Assignment, text: str, ticket: Ticket | None) -> None:
        now = self.fences.clock()
        entry = FenceEntry(uid=a.pod.uid, namespace=a.pod.namespace, name=a.pod.name, digest=assignment_digest(text),
                           expires=now + F.ENTRY_TTL_S, batch=f"{ev.gang_id}#{ev.attempt}")
        try:
            if ticket is None:  # the node's report began to say "device plugin" since the command came
                with self.fences.coming(a.node) as ticket:
                    await self.fences.fence(ticket, entry)
            else:
                await self.fences.fence(ticket, entry)
        except F.FenceError as e:  # the node's fence is full: pods bound earlier must be admitted first
            raise TemporaryError(str(e), delay=2.0) from e


def _ours(pod: Pod) -> bool:
    return pod.scheduler_name in SCHEDULER_NAMES


async def run(bus: Bus, cluster: ClusterPort, config: Config, *,
              task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run binder until cancelled; ready once both mirrors are listed and its durable consumer
    is live (the pod watch starts alongside and never holds binds up)."""
    own = S.CONSUMER[DURABLE]
    async with anyio.create_task_group() as tg:
        topology = KvMirror.of_bucket(bus, S.KV_TOPOLOGY)
        ledger = LedgerBook(bus)
        mig = KvMirror.of_bucket(bus, S.KV_MIG)
        await tg.start(topology.run)
        await tg.start(ledger.run)
        await tg.start(mig.run)
        fences = NodeFences(tg, cluster, namespace=config.fence_namespace,
                            holder=config.instance or default_instance())
        pods = PodWatch(cluster, fenced=partial(node_fenced, topology), release=fences.release)
        binder = Binder(bus, cluster, topology=topology, ledger=ledger, mig=mig, fences=fences, pods=pods)
        tg.start_soon(pods.run)
        await tg.start(binder.answers.run)
        log("binder settings", parallelism=config.parallelism, fence_namespace=config.fence_namespace,
            holder=fences.holder)
        await tg.start(lambda task_status: consume(
            bus, stream=own.stream, durable=own.durable, filter_subject=own.filter, decoder=gang_decoder,
            handler=binder.on_command, concurrency=config.parallelism, task_status=task_status))
        evict = S.CONSUMER[EVICT_DURABLE]
        await tg.start(lambda task_status: consume(
            bus, stream=evict.stream, durable=evict.durable, filter_subject=evict.filter, decoder=gang_decoder,
            handler=binder.on_command, concurrency=EVICT_COMMANDS_AT_ONCE, task_status=task_status))
        task_status.started()

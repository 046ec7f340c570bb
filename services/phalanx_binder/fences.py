"""binder's writes to the per-node fences (``phalanx_kube.fence``; docs/delivery.md), batched
per node.

A bind to a node whose agent serves the device plugin waits for a fence write that lists the
pod before its Binding. The writes of one node are group commits, one after another:

* ``coming(node)`` is entered by every bind as soon as it starts: the bind is on its way to
  the node's fence. ``fence(ticket, entry)`` queues its entry for the node's next write and
  returns once a write that lists it succeeded (or raises that write's error).
* Before each write, the node's writer waits until every bind that is coming has queued its
  entry or left (at most ``linger_s``). binder handles the commands of a gang at the same time
  (they are published together), so a gang's pods on one node go in one write, and gangs never
  wait on each other pod by pod: binds that arrive during a write share the next one.
* ``release(node, uids)`` queues removals for the node's next write and returns at once. A
  release of uids the fence does not list writes nothing. A release that fails is logged and
  dropped: the entries lapse on their own (``ENTRY_TTL_S``), and a lapsed or stale entry blocks
  nothing (the plugin reads the pod).
* Each write is a compare-and-set on the resourceVersion of the lease this writer last wrote
  or read, so while binder is the only writer a write costs one request; a conflict (another
  replica wrote) costs a read and a retry.

``fenced(node)`` is what the fence listed at the last write or read (``None`` before any).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio

from phalanx_kube import fence as F
from phalanx_kube.port import ClusterPort, Lease
from phalanx_proto.kubeapi import FenceEntry
from phalanx_telemetry import log, metrics, warn

LINGER_S = 1.0
"""The longest a node's next write waits for binds that are still on their way to it."""


@dataclass(eq=False)
class _Round:
    """One write's outcome, awaited by the binds whose entries it carries."""

    done: anyio.Event = field(default_factory=anyio.Event)
    error: BaseException | None = None


@dataclass(eq=False)
class _Node:
    name: str
    coming: int = 0
    adds: dict[str, FenceEntry] = field(default_factory=dict)
    removes: set[str] = field(default_factory=set)
    round: _Round | None = None
    writing: bool = False
    lease: Lease | None | F.Unknown = F.UNKNOWN
    fenced: frozenset[str] | None = None
    changed: anyio.Event = field(default_factory=anyio.Event)

    def poke(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


@dataclass(eq=False)
class Ticket:
    """A bind on its way to ``node``'s fence (from ``NodeFences.coming``)."""

    node: _Node
    arrived: bool = False


class NodeFences:
    """The fences of every node binder binds to; writers run in ``tg``."""

    def __init__(self, tg: anyio.abc.TaskGroup, cluster: ClusterPort, *, namespace: str, holder: str,
                 clock: Callable[[], float] = time.time, linger_s: float = LINGER_S) -> None:
        self.tg = tg
        self.cluster = cluster
        self.namespace = namespace
        self.holder = holder
        self.clock = clock
        self.linger_s = linger_s
        self._nodes: dict[str, _Node] = {}

    def _node(self, name: str) -> _Node:
        n = self._nodes.get(name)
        if n is None:
            n = self._nodes[name] = _Node(name)
        return n

    def fenced(self, node: str) -> frozenset[str] | None:
        """The uids the node's fence listed at this writer's last write or read."""
        n = self._nodes.get(node)
        return None if n is None else n.fenced

    @contextmanager
    def coming(self, node: str) -> Iterator[Ticket]:
        """While inside, the node's next write waits for this bind (see the module docstring)."""
        t = Ticket(self._node(node))
        t.node.coming += 1
        try:
            yield t
        finally:
            self._arrive(t)

    def done(self, t: Ticket) -> None:
        """The bind is no longer on its way (it fenced, or stopped before): the node's next
        write need not wait for it. Leaving ``coming`` does this too; twice is harmless."""
        self._arrive(t)

    def _arrive(self, t: Ticket) -> None:
        if not t.arrived:
            t.arrived = True
            t.node.coming -= 1
            t.node.poke()

    async def fence(self, ticket: Ticket, entry: FenceEntry) -> None:
        """Return once a write listing ``entry`` succeeded; raise that write's error."""
        n = ticket.node
        n.adds[entry.uid] = entry
        n.removes.discard(entry.uid)
        rnd = n.round = n.round or _Round()
        self._arrive(ticket)
        self._start(n)
        await rnd.done.wait()
        if rnd.error is not None:
            raise rnd.error

    def release(self, node: str, uids: set[str]) -> None:
        """Drop ``uids`` from the node's fence at its next write (no wait)."""
        n = self._node(node)
        if n.fenced is not None and not (uids & n.fenced) and not (uids & n.adds.keys()):
            return
        n.removes |= uids
        for uid in uids:
            n.adds.pop(uid, None)
        self._start(n)

    def _start(self, n: _Node) -> None:
        if not n.writing:
            n.writing = True
            self.tg.start_soon(self._write, n)

    async def _write(self, n: _Node) -> None:
        try:
            while n.adds or n.removes:
                with anyio.move_on_after(self.linger_s):
                    while n.coming > 0:
                        await n.changed.wait()
                adds, removes, rnd = n.adds, n.removes, n.round
                n.adds, n.removes, n.round = {}, set(), None
                try:
                    await self._write_once(n, list(adds.values()), removes)
                except Exception as e:  # noqa: BLE001 - the binds waiting on it get the error
                    n.lease = F.UNKNOWN
                    metrics.FENCE_WRITES.inc(result="failed")
                    warn("fence write failed", node=n.name, adding=len(adds), releasing=len(removes),
                         error=repr(e)[:300])
                    if rnd is not None:
                        rnd.error = e
                finally:
                    if rnd is not None:
                        rnd.done.set()
        finally:
            n.writing = False

    async def _write_once(self, n: _Node, adds: list[FenceEntry], removes: set[str]) -> None:
        now = self.clock()
        out = await F.change(self.cluster, namespace=self.namespace, node=n.name, holder=self.holder, now=now,
                             add=adds, remove=removes, known=n.lease)
        n.lease = out.lease
        try:
            n.fenced = frozenset(e.uid for e in F.read(out.lease, n.name, now).pods) if out.lease else frozenset()
        except F.FenceError:
            n.fenced = None
        metrics.FENCE_WRITES.inc(result="written" if out.wrote else "unchanged")
        if adds:
            metrics.FENCE_BATCH_PODS.observe(len(adds))
        log("fence written" if out.wrote else "fence unchanged", level=10, node=n.name, added=len(adds),
            released=len(removes), listed=len(n.fenced or ()))

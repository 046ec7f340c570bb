"""Decisions assumed into placement's cache before their ledger writes are stored
(docs/scale.md, "Placement's cache and scheduling cycle"): a ``Commit`` is one atomic batch;
an ``Assumed`` is a node's ledger (or a queue's usage) as that batch will leave it, built on the
revision the decision read or on an earlier assumption. A later decision may build on an
assumption; if the earlier batch fails, every batch built on it fails too (``fail``), and a
batch is sent expecting the revisions its decision read (``expected``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import anyio

from phalanx_bus import KvConflict
from phalanx_proto import subjects as S
from phalanx_proto.events import encoder
from phalanx_proto.queues import QueueUsage
from phalanx_proto.state import NodeLedger


@dataclass(eq=False)
class Commit:
    """One atomic batch of ledger writes: node key → the node's whole new ledger, and
    ``queue.<q>`` → the queue's whole new usage (``phalanx_proto.queues``)."""

    writes: dict[str, NodeLedger | QueueUsage]
    done: anyio.Event = field(default_factory=anyio.Event)
    revisions: dict[str, int] | None = None
    """The revision of each write, once committed."""
    failed: bool = False
    dependents: list[Commit] = field(default_factory=list)
    """Commits whose decisions read this one's assumed ledgers: they fail if it does."""


@dataclass(eq=False)
class Assumed:
    """A node's ledger (or a queue's usage) as a commit not yet echoed by the watch will leave it."""

    ledger: NodeLedger | QueueUsage
    commit: Commit
    base: int | Assumed
    """What the decision read: the mirror's revision (0: no entry), or an earlier assumption."""


async def expected(commit: Commit, assumptions: Mapping[str, Assumed]) -> list[tuple[str, bytes, int]]:
    """The commit's atomic batch, in key order: each write expecting the revision its decision
    read (waiting for an earlier commit it was built on). Raises ``KvConflict`` when that
    revision came from a failed commit."""
    out = []
    for key in sorted(commit.writes):
        base = _base_of(assumptions.get(key), commit, key)
        if isinstance(base, Assumed):
            await base.commit.done.wait()
            if base.commit.failed or base.commit.revisions is None:
                raise KvConflict(f"{S.KV_LEDGER}/{key}: built on a commit that failed")
            base = base.commit.revisions[key]
        out.append((key, encoder.encode(commit.writes[key]), base))
    return out


def settle(commit: Commit, last_seq: int) -> list[str]:
    """The commit's batch is stored, ``last_seq`` its last write's stream sequence (the writes
    of one batch are stored one after another, in key order): its revisions; its keys."""
    keys = sorted(commit.writes)
    commit.revisions = {k: last_seq - (len(keys) - 1 - i) for i, k in enumerate(keys)}
    commit.done.set()
    commit.dependents.clear()  # they may commit now; nothing more to fail them for
    return keys


def fail_commit(commit: Commit) -> list[Commit]:
    """The commit failed: it and every commit whose decision read its assumptions, marked
    failed and done (each fails when it tries to commit: ``expected``)."""
    doomed, stack = [], [commit]
    while stack:
        c = stack.pop()
        if c.failed and c is not commit:
            continue
        c.failed = True
        c.done.set()
        doomed.append(c)
        stack.extend(d for d in c.dependents if not d.failed)
    return doomed


def _base_of(top: Assumed | None, commit: Commit, key: str) -> int | Assumed:
    """What ``commit``'s write of ``key`` was built on (walking down from the newest assumption)."""
    while top is not None and top.commit is not commit:
        base = top.base
        top = base if isinstance(base, Assumed) else None
    if top is None:
        raise KvConflict(f"{S.KV_LEDGER}/{key}: the assumption was dropped before its commit")
    return top.base

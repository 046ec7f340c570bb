"""The gang state store: ``phx-gangs``, read and written by compare-and-set only.

Only gang-coordinator writes this bucket (contract C4). A transition is a pure function of the
stored state (``saga.py``) applied in a bounded compare-and-set loop; it returns both sides,
so the caller can derive the side effects (``effects.entered``). A value that does not decode,
or breaks the bucket's rule, is never fatal: ``load`` raises ``UnreadableRecord`` for that one
gang (its pods are told), ``all`` returns it apart, and everything else goes on.

``all`` (the resync's and the reconciler's view of every gang) comes from a ``KvMirror`` of
the bucket fed by a KV watch once ``run`` has started it, so a tick costs no read of the
bucket.

A gang's state as this store last wrote or read it is kept with its revision (only
gang-coordinator writes the bucket, one replica), so ``load`` and ``get`` read no KV entry
while that is still the newest revision the mirror knows of the key, nor, before a write, for a
key the mirror has never seen (a new gang: its create fails if the key exists after all, and
is retried); a change from elsewhere
(the mirror shows a later revision, a value that does not decode included) makes it read the
key again. Writes stay compare-and-set on that revision: a conflict reads the key afresh and
applies the change again, so a stale copy costs one retry and never a lost update.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import msgspec

from phalanx_bus import BadEntry, Kv, KvConflict, KvMirror, Record, read_all, read_one
from phalanx_proto import subjects as S
from phalanx_proto.events import encoder
from phalanx_proto.state import GangState

CAS_RETRIES = 50


class UnreadableRecord(Exception):
    """The gang's record in ``phx-gangs`` cannot be believed (``bad`` says why)."""

    def __init__(self, bad: BadEntry) -> None:
        super().__init__(str(bad))
        self.bad = bad


@dataclass(frozen=True, slots=True)
class Transition:
    """A stored change: the state before (None: the gang was new) and after."""

    before: GangState | None
    after: GangState


Change = Callable[[GangState | None], GangState | None]


class GangStore:
    def __init__(self, kv: Kv, mirror: KvMirror | None = None) -> None:
        self.kv = kv
        self.mirror = mirror
        self._known: dict[str, tuple[GangState, int]] = {}
        """Gang key → (state, revision) as last written or read here."""

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the bucket in ``mirror`` until cancelled (started once it is listed)."""
        assert self.mirror is not None, "a store without a mirror has nothing to run"
        await self.mirror.run(task_status=task_status)

    async def load(self, gang_id: str, *, fresh: bool = False,
                   to_write: bool = False) -> tuple[GangState | None, int | None]:
        """The gang's state and revision; ``(None, None)`` when absent. Raises ``UnreadableRecord``.
        ``fresh``: read the key even when the kept copy looks current. ``to_write``: the caller
        writes by compare-and-set on what it gets, so a key the mirror has never seen is taken
        for absent without a read (were it there after all, the create fails and is retried)."""
        key = S.gang_key(gang_id)
        known = self._known.get(key)
        if known is not None and not fresh and known[1] >= self._mirrored_revision(key):
            return known
        if known is None and not fresh and to_write and self._absent(key):
            return None, None  # a new gang: its create is a compare-and-set, so a lagging mirror costs a retry
        rec = await read_one(self.kv, key)
        if rec is None or isinstance(rec, BadEntry):
            self._known.pop(key, None)
            if rec is None:
                return None, None
            raise UnreadableRecord(rec)
        self._keep(key, rec.value, rec.revision)
        return rec.value, rec.revision

    def _keep(self, key: str, state: GangState, revision: int) -> None:
        """Keep (state, revision) unless a later revision is kept already (tasks interleave)."""
        known = self._known.get(key)
        if known is None or known[1] < revision:
            self._known[key] = (state, revision)

    def _absent(self, key: str) -> bool:
        """The running mirror holds nothing for ``key``, good or bad."""
        return self.mirror is not None and self.mirror.started and self.mirror.get(key) is None \
            and key not in self.mirror.poisoned

    def _mirrored_revision(self, key: str) -> int:
        """The latest revision of ``key`` the mirror has seen (0: none, or no mirror running)."""
        if self.mirror is None or not self.mirror.started:
            return 0
        entry, bad = self.mirror.get(key), self.mirror.poisoned.get(key)
        return max(entry.revision if entry is not None else 0, bad.revision if bad is not None else 0)

    async def get(self, gang_id: str) -> GangState | None:
        """The gang's state, or None when absent or unreadable (for read-only checks)."""
        try:
            return (await self.load(gang_id))[0]
        except UnreadableRecord:
            return None

    async def transition(self, gang_id: str, change: Change) -> Transition | None:
        """Apply ``change(state) -> new state | None`` by compare-and-set, retrying on conflict.
        Returns the stored transition, or None when ``change`` declined."""
        key = S.gang_key(gang_id)
        for attempt in range(CAS_RETRIES):
            state, rev = await self.load(gang_id, fresh=attempt > 0, to_write=True)
            new = change(state)
            if new is None:
                return None
            new = msgspec.structs.replace(new, updated_at=time.time())
            data = encoder.encode(new)
            try:
                if rev is None:
                    written = await self.kv.create(key, data)
                else:
                    written = await self.kv.update(key, data, last=rev)
            except KvConflict:
                continue  # the next round reads the key afresh
            self._keep(key, new, written)
            return Transition(state, new)
        raise RuntimeError(f"gang {gang_id}: too many concurrent updates")

    async def delete(self, gang_id: str) -> None:
        self._known.pop(S.gang_key(gang_id), None)
        await self.kv.delete(S.gang_key(gang_id))

    async def delete_if(self, gang_id: str, keep: Callable[[GangState], bool]) -> bool:
        """Delete the gang's entry unless ``keep(state)``, by compare-and-set (a member admitted
        meanwhile keeps it); True when deleted."""
        try:
            state, rev = await self.load(gang_id, fresh=True)
        except UnreadableRecord:
            return False
        if state is None or rev is None or keep(state):
            return False
        self._known.pop(S.gang_key(gang_id), None)
        try:
            await self.kv.delete(S.gang_key(gang_id), last=rev)
        except KvConflict:
            return False
        return True

    async def all(self, *, current: bool = False) -> tuple[list[GangState], list[BadEntry]]:
        """Every readable gang state, and the bad entries apart (logged once, counted): from
        the mirror once it is listed, else read from the bucket. ``current``: include every
        write the bucket had when called (the mirror catches up first), as a fresh read would."""
        if self.mirror is not None and self.mirror.started:
            if current:
                await self.mirror.catch_up()
            return ([e.value for e in self.mirror],
                    [BadEntry(S.KV_GANGS, p.key, p.revision, p.error) for p in self.mirror.poisoned.values()])
        good, bad = await read_all(self.kv)
        return [r.value for r in good if isinstance(r, Record)], bad

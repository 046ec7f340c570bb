"""KV buckets: compare-and-set access to one bucket (``Kv``, style rule 7) and the atomic
batch that commits several keys at once (``kv_atomic_write``, placement's ledger commit).

``Bus.kv(bucket)`` hands out the ``Kv`` of a bucket; nothing else constructs one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import nats.errors
import nats.js.errors

from phalanx_bus.errors import BusError, KvConflict


class Connection(Protocol):
    """What a bucket needs of the bus (``phalanx_bus.bus.Bus`` is one): its NATS connection, and
    the ``Kv`` of a bucket."""

    nc: Any

    async def kv(self, bucket: str, **kw: Any) -> Kv: ...


@dataclass(frozen=True, slots=True)
class KvEntry:
    key: str
    value: bytes
    revision: int
    deleted: bool = False


async def _cas(write, conflict: str) -> int:
    """Await a KV write, mapping "wrong last sequence" (err_code 10071) to ``KvConflict``."""
    try:
        return await write
    except nats.js.errors.KeyWrongLastSequenceError as e:
        raise KvConflict(conflict) from e
    except nats.js.errors.APIError as e:
        if e.err_code == 10071:
            raise KvConflict(conflict) from e
        raise


class Kv:
    """Compare-and-set access to one KV bucket (style rule 7)."""

    def __init__(self, bus: Connection, bucket: str, handle) -> None:
        self._bus = bus
        self.bucket = bucket
        self._kv = handle

    async def get(self, key: str) -> KvEntry | None:
        try:
            e = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        if getattr(e, "operation", None) in ("DEL", "PURGE"):
            return None
        return KvEntry(key, e.value or b"", e.revision)  # nats-py reads an empty value as None

    async def tombstone(self, key: str) -> int:
        """The revision of the key's delete marker when its last value was deleted, else 0: what
        an atomic batch must expect as the key's last sequence to create it anew."""
        try:
            await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError as e:
            entry = getattr(e, "entry", None)
            return entry.revision if entry is not None and getattr(e, "op", None) in ("DEL", "PURGE") else 0
        return 0

    async def create(self, key: str, value: bytes) -> int:
        """Create ``key``; raise ``KvConflict`` when it exists."""
        return await _cas(self._kv.create(key, value), f"{self.bucket}/{key} exists")

    async def update(self, key: str, value: bytes, *, last: int) -> int:
        """Write ``key`` only if its revision is still ``last``; raise ``KvConflict`` otherwise."""
        return await _cas(self._kv.update(key, value, last=last), f"{self.bucket}/{key} changed since revision {last}")

    async def put(self, key: str, value: bytes) -> int:
        return await self._kv.put(key, value)

    async def delete(self, key: str, *, last: int | None = None) -> None:
        """Delete ``key``; with ``last``, only if its revision is still ``last`` (``KvConflict``
        otherwise: nats-py reports that as a plain ``BadRequestError`` with err_code 10071)."""
        try:
            await _cas(self._kv.delete(key, last=last), f"{self.bucket}/{key} changed since revision {last}")
        except nats.js.errors.KeyNotFoundError:
            return

    async def keys(self, pattern: str = ">") -> list[str]:
        """Every key matching ``pattern`` (a subject pattern over keys, e.g. ``node-a.>``) with a
        message in the bucket (deleted keys included; ``get`` skips them).

        Read from the server's stream state (``subjects_filter``), not from a watcher: nats-py's
        watcher-based ``keys()`` can end early while keys are being written, and a snapshot
        that silently misses keys would make placement think nodes are gone.
        """
        prefix = f"$KV.{self.bucket}."
        out: list[str] = []
        offset = 0
        while True:
            req = json.dumps({"subjects_filter": f"{prefix}{pattern}", "offset": offset}).encode()
            msg = await self._bus.nc.request(f"$JS.API.STREAM.INFO.KV_{self.bucket}", req, timeout=5.0)
            resp = json.loads(msg.data)
            if "error" in resp:
                raise BusError(f"stream info for KV {self.bucket}: {resp['error']}")
            subjects = (resp.get("state") or {}).get("subjects") or {}
            out.extend(subj[len(prefix):] for subj in subjects)
            offset += len(subjects)
            total = resp.get("total", offset)
            if not subjects or offset >= total:
                return sorted(out)

    async def items(self, pattern: str = ">") -> list[KvEntry]:
        """Every live entry (of keys matching ``pattern``). Keys deleted between listing and
        reading are skipped."""
        out = []
        for k in await self.keys(pattern):
            e = await self.get(k)
            if e is not None:
                out.append(e)
        return out

    async def watch(self, keys: str = ">") -> AsyncIterator[KvEntry | None]:
        """Current values, then ``None`` once they are all delivered, then every change
        (deletions as entries with ``deleted=True``). Ends when the watcher is stopped."""
        watcher = await self._kv.watch(keys)
        listing, received = True, 0
        try:
            async for e in watcher:
                if e is None:
                    if listing and not (received == 0 and await _listing_under_way(watcher)):
                        listing = False
                        yield None
                    continue
                received += 1
                deleted = getattr(e, "operation", None) in ("DEL", "PURGE")
                yield KvEntry(e.key, e.value or b"", e.revision, deleted)
                if listing and e.delta == 0:  # nothing was pending after it: every initial value is in
                    listing = False
                    yield None
        finally:
            with anyio.move_on_after(2, shield=True):  # a cancelled reader still unsubscribes
                try:
                    await watcher.stop()
                except Exception:  # noqa: BLE001 - the connection may already be gone
                    pass


async def _listing_under_way(watcher) -> bool:
    """Whether nats-py's "initial values delivered" marker came before values that are on their
    way. nats-py sends it first when the consumer's info says nothing is pending and its
    subscription has received nothing; but the server may already have sent the values (so none
    is pending) while the client has not read them yet. The consumer's own count of what it
    delivered tells the two apart: values delivered, none received yet — the listing is still
    coming, and it ends with the value that had nothing pending after it (``delta`` 0)."""
    info = await watcher._sub.consumer_info()
    return bool(info.delivered.consumer_seq or info.num_pending)


async def kv_atomic_write(bus: Connection, bucket: str, writes: list[tuple[str, bytes, int]], *,
                          timeout_s: float = 5.0) -> int:
    """Write several KV keys in one JetStream atomic batch: all or none.

    Each write is ``(key, value, expected_revision)`` (0: the key must have no value — never
    written, or deleted: a deleted key's delete marker is looked up and expected). Any stale
    revision fails the whole batch with ``KvConflict`` and changes nothing. Returns the stream
    sequence of the last write. The server refuses batches over 1,000 messages.
    """
    if not writes:
        return 0
    if len(writes) > 1000:
        raise BusError(f"atomic batch of {len(writes)} writes exceeds the server limit of 1000")
    if any(expected == 0 for _, _, expected in writes):
        kv = await bus.kv(bucket)
        writes = [(key, value, expected or await kv.tombstone(key)) for key, value, expected in writes]
    batch_id = uuid.uuid4().hex
    last = len(writes)
    for n, (key, value, expected) in enumerate(writes, start=1):
        headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(n),
                   "Nats-Expected-Last-Subject-Sequence": str(expected)}
        subject = f"$KV.{bucket}.{key}"
        if n < last:
            await bus.nc.publish(subject, value, headers=headers)
            continue
        headers["Nats-Batch-Commit"] = "1"
        try:
            reply = await bus.nc.request(subject, value, headers=headers, timeout=timeout_s)
        except nats.errors.TimeoutError as e:
            raise BusError(f"atomic batch {batch_id} on {bucket}: no reply to commit") from e
        ack = json.loads(reply.data or b"{}")
        err = ack.get("error")
        if err:
            if err.get("err_code") == 10071:
                raise KvConflict(f"{bucket}: {err.get('description', 'wrong last sequence')}")
            raise BusError(f"atomic batch on {bucket} refused: {err}")
        return int(ack.get("seq", 0))
    return 0

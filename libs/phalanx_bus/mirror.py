"""An in-memory mirror of one KV bucket, kept current by a KV watch.

For a service that would otherwise read a whole bucket on every request (placement reads
``phx-topology``, ``phx-heartbeat`` and ``phx-ledger``; a reconciler reads ``phx-gangs``):
it starts one ``KvMirror`` per bucket with ``await tg.start(mirror.run)`` and reads memory.

Contract:

* **Started means listed.** ``run`` reports started only once every value the bucket held
  when the watch began is in the mirror; afterwards every change is applied in revision
  (stream sequence) order, as the watch delivers it.
* **What it holds.** ``entries`` maps key → ``MirrorEntry(key, value, revision)`` where
  ``value`` is the decoder's result. A deleted or purged key leaves ``entries``.
* **Undecodable values are isolated.** A value the decoder refuses (any exception), or that
  breaks the optional ``check`` (the bucket's rule: ``of_bucket`` takes it from
  ``phalanx_proto.kvrules.BUCKETS``), is never handed out, stale or new: the key leaves
  ``entries`` and appears in ``poisoned`` with its revision and the error, every such value is
  counted (``undecodable`` and the metric ``phalanx_kv_mirror_undecodable_total``), the
  bucket's ``phalanx_kv_invalid_entries`` gauge holds how many keys are poisoned, and it is
  logged once with its key until the key decodes again. The other keys are untouched.
  Consumers that must not treat a poisoned key as free (a ledger entry) look at ``poisoned``.
* **Callbacks** ``on_put(entry, previous)`` and ``on_delete(previous)`` let a consumer keep
  derived state (indexes, sums): they run inline, in revision order, after the mirror itself
  changed; ``previous`` is the entry the key held before (``None`` if none). A key turning
  undecodable is an ``on_delete`` of its last good entry. A callback that raises is logged with
  the key and counted (``callback_errors``); the mirror goes on.
* **Resumption.** Whenever the connection comes back (a server restart, a network break) or
  the watch fails, the mirror lists the bucket afresh with a new watch (last value of every
  key, then every later change) and applies the difference to what it holds: a key missing
  from the listing is deleted, a key at another revision is put again, a key at the same
  revision is left alone. The listing reflects every change made while the mirror was away,
  including a delete whose marker the server has since removed (which resuming from the last
  revision would miss), and the changes after it come from the same ordered consumer, so none
  falls in between. Between breaks, nats-py's ordered consumer re-creates itself from the last
  stream sequence it delivered when its idle heartbeats stop.
* **Catching up.** ``wait_for(revision)`` returns once the mirror has applied that stream
  sequence of the bucket; ``catch_up()`` once it has applied everything the bucket held when
  it was called (for a compare-and-set that lost: catch up, decide again). After a break both
  also wait for the new listing (``synced``): the old watch may have delivered later sequences
  while a delete whose marker is gone is known only to the listing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio

from phalanx_bus.bus import Bus
from phalanx_bus.errors import BusError
from phalanx_bus.kv import Kv, KvEntry
from phalanx_proto.kvrules import BUCKETS
from phalanx_telemetry import log, metrics, warn

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class MirrorEntry(Generic[T]):
    key: str
    value: T
    revision: int


@dataclass(frozen=True, slots=True)
class Poisoned:
    """A key whose latest value did not decode."""

    key: str
    revision: int
    error: str


class MirrorLagging(BusError):
    """``wait_for``/``catch_up`` ran out of time before the mirror reached the revision."""


RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class KvMirror(Generic[T]):
    """The mirror of bucket ``bucket`` (keys matching ``keys``), decoded by ``decoder``.

    ``decoder`` turns a value's bytes into ``T`` and raises on anything it refuses (for
    example ``msgspec.json.Decoder(NodeLedger).decode``).
    """

    def __init__(self, bus: Bus, bucket: str, decoder: Callable[[bytes], T], *,
                 check: Callable[[str, T], str] | None = None,
                 on_put: Callable[[MirrorEntry[T], MirrorEntry[T] | None], object] | None = None,
                 on_delete: Callable[[MirrorEntry[T]], object] | None = None,
                 keys: str = ">") -> None:
        self._bus = bus
        self.bucket = bucket
        self._decode = decoder
        self._check = check
        self._on_put = on_put
        self._on_delete = on_delete
        self._keys = keys
        self._entries: dict[str, MirrorEntry[T]] = {}
        self._poisoned: dict[str, Poisoned] = {}
        self.revision = 0
        """The stream sequence up to which the mirror reflects the bucket."""
        self.started = False
        self.listings = 0
        """Listings applied: 1 at start, one more after every break."""
        self.undecodable = 0
        self.callback_errors = 0
        self._listed_epoch = -1
        """``bus.reconnects`` when the last listing began: an older one means the mirror may
        miss what changed while it was away (a delete whose marker is gone) until it lists again."""
        self._changed: anyio.Event | None = None

    @classmethod
    def of_bucket(cls, bus: Bus, bucket: str, *, keys: str = ">", **kw) -> KvMirror:
        """A mirror of one of Phalanx's shared buckets (of the keys matching ``keys``), decoded
        and checked by the bucket's rule for those keys (``phalanx_proto.kvrules.BUCKETS``: the
        ledger's ``queue.*`` keys hold queue usage): a value breaking it is poisoned like an
        undecodable one."""
        rule = BUCKETS[bucket].for_key(keys)
        return cls(bus, bucket, rule.decoder.decode, check=rule.problem, keys=keys, **kw)

    # -- reading --------------------------------------------------------------------------
    @property
    def entries(self) -> Mapping[str, MirrorEntry[T]]:
        """Live, decodable keys (a read-only view; do not hold it across awaits to iterate)."""
        return self._entries

    @property
    def poisoned(self) -> Mapping[str, Poisoned]:
        return self._poisoned

    def get(self, key: str) -> MirrorEntry[T] | None:
        return self._entries.get(key)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[MirrorEntry[T]]:
        return iter(list(self._entries.values()))

    # -- catching up ----------------------------------------------------------------------
    @property
    def synced(self) -> bool:
        """Listed since the connection last came back (so ``revision`` can be trusted)."""
        return self._listed_epoch == self._bus.reconnects

    async def wait_for(self, revision: int, *, timeout_s: float = 10.0) -> None:
        """Return once the mirror has applied stream sequence ``revision`` of the bucket and,
        after a break, listed the bucket again; ``MirrorLagging`` after ``timeout_s``."""
        with anyio.move_on_after(timeout_s):
            while not (self.synced and self.revision >= revision):
                if self._changed is None:
                    self._changed = anyio.Event()
                await self._changed.wait()
            return
        raise MirrorLagging(f"mirror of {self.bucket} at revision {self.revision}"
                            f"{'' if self.synced else ' (not listed since the last reconnect)'}, "
                            f"not {revision} after {timeout_s}s")

    async def catch_up(self, *, timeout_s: float = 10.0) -> None:
        """Return once the mirror reflects every write the bucket had when this was called."""
        await self.wait_for(await self._last_seq(), timeout_s=timeout_s)

    async def _last_seq(self) -> int:
        """The stream sequence of the bucket's last write to a key this mirror follows (the
        whole bucket's, or the last message on the key filter's subjects)."""
        if self._keys == ">":
            info = await self._bus.js.stream_info(f"KV_{self.bucket}")
            return int(info.state.last_seq or 0)
        req = json.dumps({"last_by_subj": f"$KV.{self.bucket}.{self._keys}"}).encode()
        msg = await self._bus.nc.request(f"$JS.API.STREAM.MSG.GET.KV_{self.bucket}", req, timeout=5.0)
        resp = json.loads(msg.data)
        if "error" in resp:
            if resp["error"].get("code") == 404:
                return 0  # no key of the filter was ever written
            raise BusError(f"last write to {self.bucket}/{self._keys}: {resp['error']}")
        return int(resp["message"]["seq"])

    def _advance(self, revision: int) -> None:
        self.revision = revision
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    # -- running --------------------------------------------------------------------------
    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the bucket until cancelled (overview in the module docstring)."""
        failures = 0
        while True:
            seen = self._bus.reconnects
            try:
                async with anyio.create_task_group() as tg:
                    async def on_reconnect(scope=tg.cancel_scope, seen=seen) -> None:
                        await self._bus.wait_reconnect(seen)
                        scope.cancel()

                    tg.start_soon(on_reconnect)
                    await self._follow(task_status)
                    tg.cancel_scope.cancel()  # the watch ended by itself: list again
                failures = 0
            except Exception as e:  # noqa: BLE001 - server away or client trouble: list again later
                pause = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
                warn("kv mirror watch failed, listing again", bucket=self.bucket, error=repr(e)[:300],
                     retry_s=pause)
                await anyio.sleep(pause)

    async def _follow(self, task_status) -> None:
        """One watch: stage the listing, apply it as a difference, then apply live changes."""
        kv: Kv = await self._bus.kv(self.bucket)
        epoch = self._bus.reconnects
        floor = await self._last_seq()  # every write up to here is in the listing below
        staged: dict[str, KvEntry] | None = {}
        async with aclosing(kv.watch(self._keys)) as updates:
            async for e in updates:
                if staged is not None:  # still listing
                    if e is not None:
                        staged[e.key] = e
                        continue
                    self._listed_epoch = epoch
                    self._apply_listing(staged, floor)
                    staged = None
                    if not self.started:
                        self.started = True
                        task_status.started()
                elif e is not None:
                    if e.deleted:
                        self._delete(e.key)
                    else:
                        self._put(e.key, e.value, e.revision)
                    self._advance(max(self.revision, e.revision))

    def _apply_listing(self, staged: dict[str, KvEntry], floor: int) -> None:
        live = {k: e for k, e in staged.items() if not e.deleted}
        for key in [k for k in (*self._entries, *self._poisoned) if k not in live]:
            self._delete(key)
        for key, e in live.items():
            if self._known_revision(key) != e.revision:
                self._put(key, e.value, e.revision)
        self.listings += 1
        metrics.KV_MIRROR_LISTINGS.inc(bucket=self.bucket)
        top = max((e.revision for e in staged.values()), default=0)
        self._advance(max(top, floor))
        log("kv mirror listed", level=10, bucket=self.bucket, keys=len(self._entries),
            poisoned=len(self._poisoned), revision=self.revision, listings=self.listings)

    def _known_revision(self, key: str) -> int:
        entry = self._entries.get(key)
        if entry is not None:
            return entry.revision
        bad = self._poisoned.get(key)
        return bad.revision if bad is not None else -1

    # -- applying one change --------------------------------------------------------------
    def _put(self, key: str, raw: bytes, revision: int) -> None:
        previous = self._entries.get(key)
        try:
            value = self._decode(raw)
            problem = self._check(key, value) if self._check is not None else ""
        except Exception as e:  # noqa: BLE001 - any refusal of the decoder isolates this key
            self._poison(key, revision, previous, str(e))
            return
        if problem:
            self._poison(key, revision, previous, problem)
            return
        if self._poisoned.pop(key, None) is not None:
            metrics.KV_INVALID_ENTRIES.set(len(self._poisoned), bucket=self.bucket)
            log("kv value decodes again", bucket=self.bucket, key=key, revision=revision)
        entry = MirrorEntry(key, value, revision)
        self._entries[key] = entry
        if self._on_put is not None:
            self._callback(self._on_put, key, entry, previous)

    def _poison(self, key: str, revision: int, previous: MirrorEntry[T] | None, error: str) -> None:
        self.undecodable += 1
        metrics.KV_MIRROR_UNDECODABLE.inc(bucket=self.bucket)
        if key not in self._poisoned:
            warn("undecodable kv value isolated", bucket=self.bucket, key=key, revision=revision, error=error[:300])
        self._poisoned[key] = Poisoned(key, revision, error[:1000])
        metrics.KV_INVALID_ENTRIES.set(len(self._poisoned), bucket=self.bucket)
        if previous is not None:
            del self._entries[key]
            if self._on_delete is not None:
                self._callback(self._on_delete, key, previous)

    def _delete(self, key: str) -> None:
        if self._poisoned.pop(key, None) is not None:
            metrics.KV_INVALID_ENTRIES.set(len(self._poisoned), bucket=self.bucket)
        previous = self._entries.pop(key, None)
        if previous is not None and self._on_delete is not None:
            self._callback(self._on_delete, key, previous)

    def _callback(self, fn: Callable[..., object], key: str, *args: object) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - one consumer bug must not stop the mirror
            self.callback_errors += 1
            log("kv mirror callback failed", level=40, exc_info=True, bucket=self.bucket, key=key)

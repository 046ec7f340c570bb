"""Reading KV values that may be bad: decode and check each entry, skip the bad ones.

Every service that reads a shared bucket reads it through here, with the bucket's rule from
``phalanx_proto.kvrules.BUCKETS``. A value that does not decode, or decodes into something its
bucket's rule refuses, never stops the reader: it comes back as a ``BadEntry`` naming bucket,
key, revision and error, is logged once per (bucket, key, revision) in this process, and the
whole-bucket reads set ``phalanx_kv_invalid_entries{bucket}`` to the number found (0 is
healthy). What to do with a bad entry is the caller's decision (placement leaves the node out,
binder refuses a bind on it, gang-coordinator skips the gang); ``phalanx doctor`` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from phalanx_bus.kv import Kv, KvEntry
from phalanx_proto.kvrules import BUCKETS, BucketRule
from phalanx_telemetry import metrics, warn


@dataclass(frozen=True, slots=True)
class Record:
    """A value that decoded and keeps its bucket's rule."""

    key: str
    value: Any
    revision: int


@dataclass(frozen=True, slots=True)
class BadEntry:
    """A value that cannot be believed: undecodable or breaking its bucket's rule."""

    bucket: str
    key: str
    revision: int
    error: str

    def __str__(self) -> str:
        return f"{self.bucket}/{self.key} (revision {self.revision}): {self.error}"


_seen: set[tuple[str, str, int]] = set()


def check(bucket: str, entry: KvEntry, rule: BucketRule | None = None) -> Record | BadEntry:
    """Decode ``entry`` and check it against ``rule`` (default: the bucket's own)."""
    rule = (rule or BUCKETS[bucket]).for_key(entry.key)
    try:
        value = rule.decoder.decode(entry.value)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return _bad(bucket, entry, f"undecodable: {e}")
    problem = rule.problem(entry.key, value)
    if problem:
        return _bad(bucket, entry, problem)
    return Record(entry.key, value, entry.revision)


def _bad(bucket: str, entry: KvEntry, error: str) -> BadEntry:
    bad = BadEntry(bucket, entry.key, entry.revision, error)
    if (bucket, entry.key, entry.revision) not in _seen:
        _seen.add((bucket, entry.key, entry.revision))
        warn("bad kv entry skipped", bucket=bucket, key=entry.key, revision=entry.revision, error=error)
    return bad


async def read_all(kv: Kv, rule: BucketRule | None = None, pattern: str = ">") -> tuple[list[Record], list[BadEntry]]:
    """Every live entry of the bucket (of keys matching ``pattern``, for an identity that may
    read only some keys): the good ones and the bad ones, apart. Sets
    ``phalanx_kv_invalid_entries{bucket}`` to the number of bad ones."""
    good: list[Record] = []
    bad: list[BadEntry] = []
    for entry in await kv.items(pattern):
        out = check(kv.bucket, entry, rule)
        (good if isinstance(out, Record) else bad).append(out)
    metrics.KV_INVALID_ENTRIES.set(len(bad), bucket=kv.bucket)
    return good, bad


async def read_one(kv: Kv, key: str, rule: BucketRule | None = None) -> Record | BadEntry | None:
    """One entry (None when absent)."""
    entry = await kv.get(key)
    return None if entry is None else check(kv.bucket, entry, rule)

"""The NATS JetStream adapter: the only package that imports ``nats``.

Mechanisms every service uses (style rules 6 and 7):

* ``Bus.connect`` — a connection that reconnects forever, with JetStream and KV handles;
* ``Bus.declare`` — streams and KV buckets of the bus table (admin identity only);
* ``Bus.publish`` — an event with ``Nats-Msg-Id`` (its idempotency key) and W3C trace headers;
* ``consume`` (``phalanx_bus.consumer``) — a durable pull-consumer loop with the ack ladder;
* ``Kv`` — compare-and-set access to a KV bucket;
* ``phalanx_bus.records`` — reading values that may be bad (skipped, counted, named);
* ``KeyedWork`` (``phalanx_bus.keyed``) — concurrent jobs, one key's in order;
* ``KvMirror`` (``phalanx_bus.mirror``) — a bucket mirrored in memory from a KV watch.
"""

from phalanx_bus.bus import (
    Bus,
    BusAuth,
    BusError,
    DecodeFailure,
    Kv,
    KvConflict,
    KvEntry,
    enable_atomic,
    kv_atomic_write,
    tail,
)
from phalanx_bus.consumer import Delivery, PermanentError, TemporaryError, consume
from phalanx_bus.keyed import KeyedWork
from phalanx_bus.mirror import KvMirror, MirrorEntry, MirrorLagging, Poisoned
from phalanx_bus.records import BadEntry, Record, read_all, read_one

__all__ = [
    "Bus", "BusAuth", "BusError", "DecodeFailure", "Kv", "KvEntry", "KvConflict", "enable_atomic", "kv_atomic_write",
    "tail", "Delivery", "KeyedWork", "PermanentError", "TemporaryError", "consume", "BadEntry", "Record", "read_all", "read_one",
    "KvMirror", "MirrorEntry", "MirrorLagging", "Poisoned",
]

"""The NATS JetStream adapter: the only package that imports ``nats``.

Mechanisms every service uses (style rules 6 and 7):

* ``Bus.connect`` — a connection that reconnects forever, with JetStream and KV handles;
* ``Bus.declare`` (``phalanx_bus.declare``) — streams, KV buckets and durables of the bus table,
  with their limits (admin identity only);
* ``Bus.publish`` — an event with ``Nats-Msg-Id`` (its idempotency key, signed by the identity:
  ``phalanx_bus.msgid``) and W3C trace headers;
* ``consume`` (``phalanx_bus.consumer``) — a durable pull-consumer loop with the ack ladder
  (``phalanx_bus.handling``);
* ``BatchSender`` (``phalanx_bus.batching``) — gang events sharing a hop sent as one ``GangBatch``;
* ``Kv`` (``phalanx_bus.kv``) — compare-and-set access to a KV bucket, and the atomic batch;
* ``phalanx_bus.records`` — reading values that may be bad (skipped, counted, named);
* ``KeyedWork`` (``phalanx_bus.keyed``) — concurrent jobs, one key's in order;
* ``KvMirror`` (``phalanx_bus.mirror``) — a bucket mirrored in memory from a KV watch.
"""

from phalanx_bus.batching import BatchSender, sender_id
from phalanx_bus.bus import Bus, BusAuth, DecodeFailure, tail
from phalanx_bus.consumer import Delivery, PermanentError, TemporaryError, consume
from phalanx_bus.declare import enable_atomic
from phalanx_bus.errors import BusError, KvConflict
from phalanx_bus.keyed import KeyedWork
from phalanx_bus.kv import Kv, KvEntry, kv_atomic_write
from phalanx_bus.mirror import KvMirror, MirrorEntry, MirrorLagging, Poisoned
from phalanx_bus.records import BadEntry, Record, read_all, read_one
from phalanx_bus.stored import Stored, stored_messages

__all__ = [
    "BatchSender", "sender_id", "Stored", "stored_messages",
    "Bus", "BusAuth", "BusError", "DecodeFailure", "Kv", "KvEntry", "KvConflict", "enable_atomic", "kv_atomic_write",
    "tail", "Delivery", "KeyedWork", "PermanentError", "TemporaryError", "consume", "BadEntry", "Record", "read_all", "read_one",
    "KvMirror", "MirrorEntry", "MirrorLagging", "Poisoned",
]

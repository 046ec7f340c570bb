"""``phalanx asyncapi``: write (or check) ``proto/asyncapi.yaml``, the AsyncAPI 3.0 contract.

The document is generated from ``proto/``: channels, their messages, who publishes and who
consumes them come from the bus table in ``phalanx_proto.subjects`` (the same table the
server's permissions derive from), messages are the event types of ``phalanx_proto.events``
and the KV values of ``phalanx_proto.state``, and every payload points at the JSON Schema that
``phalanx schema`` writes into ``proto/schema/``.

``tests/unit/test_asyncapi.py`` fails when the checked-in file drifts from this generator;
``--check`` exits 1 in that case, like ``phalanx schema --check``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from phalanx_proto import events as E
from phalanx_proto import subjects as S

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "proto" / "asyncapi.yaml"
VERSION = "0.1.0"
"""The contract's version (``info.version``); bump with incompatible changes, which the rules
in docs/events.md forbid for existing tags."""

PARAMETERS = {
    "gang": "The gang's key, gang_key(gang_id): '<namespace>.<name>' with every byte outside "
            "[A-Za-z0-9-] written as '_' and two hex digits ('.' is '_2e', '_' is '_5f', ':' is '_3a'), so "
            "no two gangs share it (two subject tokens; subscribe with '*.*' or '>').",
    "node": "The node name as one subject token (token(node): characters outside [A-Za-z0-9_-] become '_').",
    "stream": "The stream the dead message came from (PHX_GANG, PHX_TOPOLOGY, PHX_NODE, PHX_DEADLINE).",
    "consumer": "The durable consumer that gave the message up (placement, binder, gang-coordinator, "
                "mig-manager-<node>, ...).",
    "replica": "One placement process: its pod (or host) name, pid and a random part, as one subject token.",
    "queue": "The queue's name as one subject token (token(name): characters outside [A-Za-z0-9_-] become '_').",
    "pool": "A DRA pool as one key: its driver and pool names made key-safe, then a digest of both (phalanx_proto.dra.pool_key).",
}


@dataclass(frozen=True)
class Channel:
    id: str
    address: str
    messages: tuple[str, ...]
    """Message ids (event tags, or the ids of ``EXTRA_MESSAGES``)."""
    producer: str
    consumer: str
    description: str
    stream: str = ""
    durable: str = ""
    carries: tuple[str, ...] = ()
    """Event tags that travel inside the channel's ``gang.batch`` messages (``x-phalanx-carries``)."""


_PRODUCER = {"deadlineFired": "the NATS server", "deadLetter": "every consumer"}
_MESSAGES = {"deadlineSchedule": ("deadline.scheduled",), "deadLetter": ("dead_letter",)}


def _channels() -> tuple[Channel, ...]:
    """The channels of the bus table, then its KV buckets that hold schema'd values."""
    out = []
    for ch in S.CHANNELS:
        durables = [c.durable for c in S.CONSUMERS if ch.id in c.channels]
        out.append(Channel(ch.id, ch.template, _MESSAGES.get(ch.id, ch.kinds),
                           _PRODUCER.get(ch.id, ", ".join(ch.publishers)), ch.receiver, ch.description, ch.stream,
                           durables[0] if durables else "", ch.carries))
    for b in S.BUCKETS:
        if not b.value:
            continue
        writers = ", ".join(g.identity for g in b.grants if g.level == S.WRITE)
        readers = ", ".join(dict.fromkeys(g.identity for g in b.grants if g.level in (S.READ, S.WATCH)))
        cid = "kv" + "".join(w.capitalize() for w in b.name.removeprefix("phx-").split("-"))
        out.append(Channel(cid, f"$KV.{b.name}.{b.key}", (b.value,), writers, readers,
                           f"KV {b.name}: {b.description} (watch it as a subscription on this subject, or with "
                           "a KV watcher).", f"KV_{b.name}"))
    return tuple(out)


CHANNELS = _channels()


def _summary(t: type) -> str:
    return (t.__doc__ or "").strip().splitlines()[0] if t.__doc__ else t.__name__


def _messages() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for t in E.ALL_EVENTS:
        tag = E.tag_of(t)
        out[tag] = {
            "name": tag, "title": t.__name__, "summary": _summary(t), "contentType": "application/json",
            "headers": {"$ref": "#/components/schemas/PhalanxHeaders"},
            "payload": {"$ref": f"schema/{tag}.json"},
        }
    out["deadline.scheduled"] = {
        "name": E.tag_of(E.GangDeadline), "title": "GangDeadline (scheduled)",
        "summary": "A GangDeadline waiting on the schedule subject until its time.", "contentType": "application/json",
        "headers": {"$ref": "#/components/schemas/ScheduleHeaders"},
        "payload": {"$ref": f"schema/{E.tag_of(E.GangDeadline)}.json"},
    }
    out["dead_letter"] = {
        "name": "dead_letter", "title": "Dead letter",
        "summary": "The original message a consumer gave up on, unchanged (it may not decode).",
        "contentType": "application/json", "headers": {"$ref": "#/components/schemas/DeadLetterHeaders"},
        "payload": {"description": "The original payload, byte for byte."},
    }
    for name, ref in (("GangState", "kv.GangState.json"), ("NodeLedger", "kv.NodeLedger.json"),
                      ("NodeTopologyReported", f"{E.tag_of(E.NodeTopologyReported)}.json"),
                      ("NodeHeartbeat", f"{E.tag_of(E.NodeHeartbeat)}.json"),
                      ("NodeKubeState", "kv.NodeKubeState.json"), ("NodeMig", "kv.NodeMig.json"),
                      ("QueueSpec", "kv.QueueSpec.json"), ("QueueUsage", "kv.QueueUsage.json"),
                      ("QueueHistory", "kv.QueueHistory.json"), ("DraPool", "kv.DraPool.json")):
        out[f"kv.{name}"] = {
            "name": f"kv.{name}", "title": f"KV value {name}",
            "summary": "The JSON value of one key (a deleted key is a message with header KV-Operation: DEL).",
            "contentType": "application/json", "payload": {"$ref": f"schema/{ref}"},
        }
    return out


SCHEMAS = {
    "PhalanxHeaders": {
        "type": "object",
        "required": ["Nats-Msg-Id", "Phalanx-Kind"],
        "properties": {
            "Nats-Msg-Id": {"type": "string", "description": "The event's idempotency key (event.key()): the "
                            "server drops a second publish with the same id inside the two-minute duplicate "
                            "window, and handlers use it to recognise a redelivery.",
                            "examples": ["placement.place:default/train:2:3b9a0c1d2e3f4a5b"]},
            "Phalanx-Kind": {"type": "string", "description": "The event's tag, the same as its 'kind' field."},
            "traceparent": {"type": "string", "description": "W3C trace context of the publishing span."},
            "tracestate": {"type": "string", "description": "W3C trace state, when present."},
        },
    },
    "ScheduleHeaders": {
        "type": "object",
        "required": ["Nats-Schedule", "Nats-Schedule-Target"],
        "properties": {
            "Nats-Schedule": {"type": "string", "examples": ["@at 2026-01-01T00:00:00Z"]},
            "Nats-Schedule-Target": {"type": "string", "description": "The deadlineFired subject of the gang."},
            "Nats-Msg-Id": {"type": "string"}, "Phalanx-Kind": {"type": "string"},
            "traceparent": {"type": "string"},
        },
    },
    "DeadLetterHeaders": {
        "type": "object",
        "required": ["Phalanx-Error", "Phalanx-Original-Subject", "Phalanx-Original-Stream", "Nats-Msg-Id"],
        "properties": {
            "Phalanx-Error": {"type": "string", "description": "Why it was given up (first 1000 characters)."},
            "Phalanx-Original-Subject": {"type": "string"},
            "Phalanx-Original-Stream": {"type": "string"},
            "Nats-Msg-Id": {"type": "string", "description": "dlq:<stream>:<consumer>:<stream sequence>"},
        },
    },
}


def document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document as plain data."""
    messages = _messages()
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for ch in CHANNELS:
        params = [p for p in PARAMETERS if "{" + p + "}" in ch.address]
        channel: dict[str, Any] = {"address": ch.address, "title": ch.id, "description": ch.description}
        if params:
            channel["parameters"] = {p: {"description": PARAMETERS[p]} for p in params}
        channel["messages"] = {m: {"$ref": f"#/components/messages/{m}"} for m in ch.messages}
        if ch.stream:
            channel["x-phalanx-stream"] = ch.stream
        if ch.carries:
            channel["x-phalanx-carries"] = {
                "description": "Events carried in the 'events' of each gang.batch on this channel, each handled as "
                               "if it came alone on its gang's subject (docs/events.md, Batches).",
                "messages": [{"$ref": f"#/components/messages/{m}"} for m in ch.carries]}
        channels[ch.id] = channel
        msg_refs = [{"$ref": f"#/channels/{ch.id}/messages/{m}"} for m in ch.messages]
        operations[f"{ch.id}Send"] = {
            "action": "send", "channel": {"$ref": f"#/channels/{ch.id}"}, "messages": msg_refs,
            "summary": f"{ch.producer} publishes on {ch.address}.",
        }
        receive: dict[str, Any] = {
            "action": "receive", "channel": {"$ref": f"#/channels/{ch.id}"}, "messages": msg_refs,
            "summary": f"{ch.consumer} receives {ch.address}.",
        }
        if ch.durable:
            receive["x-phalanx-durable"] = ch.durable
        operations[f"{ch.id}Receive"] = receive
    used = {m for ch in CHANNELS for m in ch.messages} | {E.tag_of(t) for t in E.ALL_EVENTS}
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Phalanx events",
            "version": VERSION,
            "description": "The wire contract of Phalanx, the topology-aware GPU and gang scheduler: the NATS "
                           "JetStream subjects its services exchange and the KV buckets they share. Delivery is "
                           "at least once; every event carries its idempotency key as Nats-Msg-Id. Generated "
                           "from proto/ by `phalanx asyncapi`; read docs/events.md for how to subscribe.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {"host": "localhost:4222", "protocol": "nats",
                      "description": "The NATS server of `phalanx up --nats` or compose.yaml (JetStream enabled)."},
        },
        "channels": channels,
        "operations": operations,
        "components": {
            "messages": {k: v for k, v in messages.items() if k in used},
            "schemas": SCHEMAS,
        },
    }


HEADER = ("# Phalanx wire contract, AsyncAPI 3.0. GENERATED by `phalanx asyncapi` from proto/ (subjects,\n"
          "# events, KV values); do not edit. tests/unit/test_asyncapi.py fails when it drifts.\n"
          "# Payload schemas: proto/schema/*.json (`phalanx schema`). How to subscribe: docs/events.md.\n")


def render() -> str:
    return HEADER + yaml.safe_dump(document(), sort_keys=False, width=100, allow_unicode=True)


def register(sub) -> None:
    p = sub.add_parser("asyncapi", help="write the AsyncAPI 3.0 contract (proto/asyncapi.yaml)",
                       description="Generate the AsyncAPI 3.0 document of every subject and KV bucket from proto/.")
    p.add_argument("--out", default=str(DEFAULT_PATH), help="file to write (default %(default)s)")
    p.add_argument("--check", action="store_true", help="do not write; exit 1 if the file differs from the code")
    p.set_defaults(func=run)


def run(args) -> int:
    out = Path(args.out)
    text = render()
    if args.check:
        if not out.is_file() or out.read_text() != text:
            print(f"asyncapi drift: {out} (run `phalanx asyncapi`)", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0

"""``phalanx events``: tail the Phalanx subjects and print every event as it is published.

A live view (a plain NATS subscription; nothing is consumed, acked or replayed), for people
watching a cluster: one line per event with the time it arrived, the subject, the event's tag
and its key fields, or with ``--json`` one JSON object per line::

    {"time": "2026-01-01T12:00:00.123Z", "subject": "phx.gang.coord.default.train", "kind": "gang.placed",
     "event": {...the event as on the wire...}}

Messages that do not decode (a dead letter holding garbage) are shown with ``kind``
``undecodable``. Ends after ``--count`` events or ``--timeout`` seconds (0: never), or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import anyio
import msgspec

from phalanx_cli.cmd_run import add_nats, bus_auth
from phalanx_proto.events import AnyGangEvent, AnyNodeEvent, AnyTopologyEvent, Assignment, MemberSpec, PodRef

any_decoder = msgspec.json.Decoder(AnyGangEvent | AnyTopologyEvent | AnyNodeEvent)
"""Every event type of every stream (tags are unique across streams)."""


def register(sub) -> None:
    p = sub.add_parser("events", help="tail the Phalanx subjects and print decoded events",
                       description="Print every event published on the Phalanx subjects, one line per event "
                                   "(or JSON lines), as it happens.")
    p.add_argument("--subject", default="phx.>",
                   help="subject filter (NATS wildcards; default %(default)s). A subscriber identity may read "
                        "phx.gang.status.> and phx.topology.> only")
    add_nats(p)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--count", type=int, default=0, help="exit after this many events (default: never)")
    p.add_argument("--timeout", type=float, default=0.0, help="exit after this many seconds (default: never)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        anyio.run(tail_events, args)
    except KeyboardInterrupt:
        return 0
    except Exception as e:  # noqa: BLE001 - unreachable NATS: say so
        print(f"phalanx events: {e}", file=sys.stderr)
        return 2
    return 0


async def tail_events(args: argparse.Namespace, out=None) -> int:
    """Print events until ``--count``/``--timeout``; returns how many were printed."""
    from phalanx_bus import Bus, DecodeFailure, tail

    out = out or sys.stdout
    printed = 0
    bus = await Bus.connect(args.nats, service="cli-events", auth=bus_auth(args), connect_timeout_s=10.0)
    try:
        with anyio.move_on_after(args.timeout or float("inf")):
            def listening() -> None:
                print(f"phalanx events: listening on {args.subject} at {args.nats}", file=sys.stderr, flush=True)

            async for subject, event in tail(bus, args.subject, any_decoder, on_subscribed=listening):
                now = time.time()
                if isinstance(event, DecodeFailure):
                    line = _json_line(now, subject, "undecodable", {"error": event.error}) if args.json else \
                        f"{_clock(now)}  {subject}  undecodable  {event.error}"
                else:
                    kind = event.__struct_config__.tag
                    line = _json_line(now, subject, kind, msgspec.to_builtins(event)) if args.json else \
                        f"{_clock(now)}  {subject}  {kind}  {summary(event)}"
                print(line, file=out, flush=True)
                printed += 1
                if args.count and printed >= args.count:
                    break
    finally:
        with anyio.move_on_after(2, shield=True):
            await bus.close()
    return printed


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"


def _json_line(at: float, subject: str, kind: str, event: Any) -> str:
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"
    return json.dumps({"time": iso, "subject": subject, "kind": kind, "event": event}, separators=(",", ":"))


def _assignment(a: Assignment) -> str:
    text = f"{a.pod}@{a.node}:{','.join(map(str, a.gpus)) or '-'}"
    if a.core_pct or a.memory_mib:
        text += f"({a.core_pct}%,{a.memory_mib}MiB)"
    if a.mig_profile:
        text += f"(mig {a.mig_profile})"
    if a.nics:
        text += f"+{','.join(a.nics)}"
    return text


def _member(m: MemberSpec) -> str:
    what = f"{m.mig_slices} MIG" if m.mig_slices else f"{m.gpus} GPU"
    if m.core_pct or m.memory_mib:
        what += f" {m.core_pct}%/{m.memory_mib}MiB"
    return f"{m.pod}[{what}{' rdma' if m.rdma else ''}]"


def _value(value: Any) -> str | None:
    if isinstance(value, PodRef):
        return str(value)
    if isinstance(value, Assignment):
        return _assignment(value)
    if isinstance(value, MemberSpec):
        return _member(value)
    if isinstance(value, tuple | list):
        parts = [_value(v) for v in value]
        return ";".join(p for p in parts if p) if parts else None
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items()) if value else None
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, str):
        return json.dumps(value) if (" " in value or not value) else value
    if isinstance(value, bool | int):
        return str(value)
    return None


LEADING = ("gang_id", "node", "attempt")
"""Fields printed first, and even when they hold their default."""


def summary(event: msgspec.Struct) -> str:
    """The event's fields as ``key=value``, defaults left out, nested topology summarised."""
    parts = []
    fields = sorted(msgspec.structs.fields(event), key=lambda f: (LEADING.index(f.name) if f.name in LEADING
                                                                 else len(LEADING)))
    for info in fields:
        value = getattr(event, info.name)
        if info.name not in LEADING and not info.required and info.default is not msgspec.NODEFAULT \
                and value == info.default:
            continue
        if info.name == "topology":
            parts.append(f"gpus={len(value.gpus)} nics={len(value.nics)} generation={value.generation}")
            continue
        if info.name == "tiers":
            tiers = [t for t in (value.hypernode, value.leaf, value.netpod) if t]
            if tiers:
                parts.append(f"tiers={'/'.join(tiers)}")
            continue
        text = _value(value)
        if text:
            parts.append(f"{info.name}={text}")
    return " ".join(parts)

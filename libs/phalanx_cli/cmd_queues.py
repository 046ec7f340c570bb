"""``phalanx queues``: each queue's quota, limit, what it holds and borrows, what waits, and its
fair share — read from the bus as the read-only identity (``phx-queues``, the reservations in
``phx-ledger``, the gang records, the nodes' topology), the same numbers gang-coordinator
writes to each Queue's status (``phalanx_rules.queues.queue_report``).

A table, children indented under their parent, or with ``--json`` one document::

    {"queues": [{"queue", "parent", "quota", "limit", "allocated", "borrowed", "pendingGangs",
                 "pendingGPUs", "fairShare", "recentGPUHours", "problem"}]}

Amounts are GPUs (whole-GPU equivalents). ``RECENT-GPU-H`` is each queue's recent usage: the
GPU-hours it held, each hour counting half as much one half-life later (placement's
``--usage-half-life-s``; its records in ``phx-ledger``); with it on, the fair share of the GPUs
beyond the quotas goes first to the queues that used less lately (docs/queues.md). Exit 0, or
2 when the bus cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import anyio

from phalanx_cli.cmd_run import add_nats, connect_bus, one_line
from phalanx_cli.terminal import safe, safe_lines

COLUMNS = (("QUEUE", "queue"), ("PARENT", "parent"), ("QUOTA", "quota"), ("LIMIT", "limit"),
           ("ALLOCATED", "allocated"), ("BORROWED", "borrowed"), ("PENDING-GANGS", "pendingGangs"),
           ("PENDING-GPUS", "pendingGPUs"), ("FAIR-SHARE", "fairShare"), ("RECENT-GPU-H", "recentGPUHours"),
           ("PROBLEM", "problem"))


def register(sub) -> None:
    p = sub.add_parser("queues", help="each queue's quota, limit, allocation, borrowing, waiting gangs, fair share",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_nats(p)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for NATS (default %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        rows = anyio.run(_bounded, args)
    except Exception as e:  # noqa: BLE001 - unreachable bus: say so, exit 2
        print(safe(f"phalanx queues: {one_line(e)}"), file=sys.stderr)
        return 2
    print(json.dumps({"queues": rows}, indent=2) if args.json else safe_lines(table(rows)))
    return 0


async def _bounded(args: argparse.Namespace) -> list[dict[str, Any]]:
    try:
        with anyio.fail_after(args.timeout):
            return await gather(args)
    except TimeoutError:
        raise TimeoutError(f"no complete answer from NATS at {args.nats} within {args.timeout:g}s") from None


async def gather(args: argparse.Namespace) -> list[dict[str, Any]]:
    from phalanx_bus import read_all
    from phalanx_proto import subjects as S
    from phalanx_proto.queues import GPU_UNITS, HISTORY_PREFIX
    from phalanx_rules.queues import QueueTree, held_by_queue, queue_report

    bus = await connect_bus(args.nats, service="cli", budget_s=args.timeout)
    try:
        specs, _ = await read_all(await bus.kv(S.KV_QUEUES))
        ledgers, _ = await read_all(await bus.kv(S.KV_LEDGER), pattern="*")
        history, _ = await read_all(await bus.kv(S.KV_LEDGER), pattern=f"{HISTORY_PREFIX}*")
        gangs, _ = await read_all(await bus.kv(S.KV_GANGS))
        reports, _ = await read_all(await bus.kv(S.KV_TOPOLOGY))
    finally:
        await bus.close()
    tree = QueueTree.of(r.value for r in specs)
    capacity = sum(len(r.value.topology.gpus) for r in reports if r.value.enabled) * GPU_UNITS
    report = queue_report(tree, held_by_queue(r.value for r in ledgers), [r.value for r in gangs], capacity,
                          (r.value for r in history), time.time())
    return [{"queue": q, **report[q]} for q in _tree_order(tree)]


def _tree_order(tree) -> list[str]:
    out: list[str] = []

    def walk(parent: str) -> None:
        for q in tree.children.get(parent, ()):
            if q in tree.specs and q not in out:
                out.append(q)
                walk(q)

    walk("")
    return out + sorted(q for q in tree.specs if q not in out)


def table(rows: list[dict[str, Any]]) -> str:
    depth = {}
    for r in rows:
        depth[r["queue"]] = depth.get(r["parent"], -1) + 1 if r["parent"] else 0
    cells = [[("  " * depth[r["queue"]] + r["queue"]) if key == "queue" else _cell(r[key]) for _, key in COLUMNS]
             for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, (h, _) in enumerate(COLUMNS)]
    lines = ["  ".join(h.ljust(w) for (h, _), w in zip(COLUMNS, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return str(value)

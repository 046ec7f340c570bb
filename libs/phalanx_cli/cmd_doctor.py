"""``phalanx doctor``: is the scheduler's recorded state sound? It says what is wrong and exits 1.

It reads only what is on the bus (no cluster access): every value of the shared KV buckets
(``phx-ledger``, ``phx-gangs``, ``phx-topology``, ``phx-heartbeat``, ``phx-mig``) against its
bucket's rule (``phalanx_proto.kvrules.BUCKETS``: it decodes, its key names it, no GPU booked
twice on a node), and gang-coordinator's reconciler lease and last report (``phx-leases``):
who holds the lease, when the last pass was, and what it found where the ledger, the gang
records and the cluster's bound pods disagree. Output is a few labelled lines, or with
``--json`` one document:

    {"healthy": bool, "problems": [str],
     "kv": {bucket: {"ok": int, "bad": [{"key", "revision", "error"}]}},
     "reconciler": {"owner", "lease_expires_at", "report_at", "findings": {kind: n}, "details": [str]} | null}

Exit codes: 0 healthy, 1 something is wrong (each problem is listed), 2 the bus cannot be reached.
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


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check the recorded state: unreadable KV values, reconciler findings",
                       description="Check every value of the shared KV buckets against its rule and show what "
                                   "gang-coordinator's reconciler last found. Exit 0 healthy, 1 problems, 2 "
                                   "unreachable.")
    add_nats(p)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--stale-after", type=float, default=60.0,
                   help="a reconciler report older than this many seconds is a problem (default %(default)s)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for NATS (default %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        report = anyio.run(_bounded, args)
    except Exception as e:  # noqa: BLE001 - unreachable bus: say so, exit 2
        print(safe(f"phalanx doctor: {one_line(e)}"), file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else safe_lines(render(report)))
    return 0 if report["healthy"] else 1


async def _bounded(args: argparse.Namespace) -> dict[str, Any]:
    """``gather`` within ``--timeout`` seconds in all, connection included."""
    try:
        with anyio.fail_after(args.timeout):
            return await gather(args)
    except TimeoutError:
        raise TimeoutError(f"no complete answer from NATS at {args.nats} within {args.timeout:g}s") from None


async def gather(args: argparse.Namespace) -> dict[str, Any]:
    from phalanx_bus import BadEntry, read_all
    from phalanx_proto import subjects as S
    from phalanx_proto.kvrules import BUCKETS, BucketRule
    from phalanx_proto.state import (
        RECONCILER_LEASE_KEY,
        RECONCILER_REPORT_KEY,
        lease_decoder,
        reconciler_report_decoder,
    )

    bus = await connect_bus(args.nats, service="cli", budget_s=args.timeout)
    try:
        kv: dict[str, Any] = {}
        problems: list[str] = []
        for bucket in BUCKETS:
            good, bad = await read_all(await bus.kv(bucket))
            kv[bucket] = {"ok": len(good), "bad": [{"key": b.key, "revision": b.revision, "error": b.error}
                                                   for b in bad]}
            problems += [f"unreadable value {b}" for b in bad]
        leases = await bus.kv(S.KV_LEASES)
        lease = await _read(leases, RECONCILER_LEASE_KEY, BucketRule(lease_decoder, lambda k, v: ""))
        report = await _read(leases, RECONCILER_REPORT_KEY, BucketRule(reconciler_report_decoder, lambda k, v: ""))
    finally:
        await bus.close()

    now = time.time()
    reconciler = None
    for item in (lease, report):
        if isinstance(item, BadEntry):
            problems.append(f"unreadable value {item}")
    lease = lease if not isinstance(lease, BadEntry) else None
    report = report if not isinstance(report, BadEntry) else None
    if lease is None or lease.expires_at < now:
        problems.append("no gang-coordinator holds the reconciler lease: nothing compares the ledger with the cluster")
    if report is None:
        problems.append("the reconciler has not reported yet")
    else:
        if now - report.at > args.stale_after:
            problems.append(f"the reconciler's last report is {now - report.at:.0f}s old")
        problems += [f"reconciler: {n} {kind.replace('_', ' ')}" for kind, n in sorted(report.findings.items()) if n]
    if lease is not None or report is not None:
        reconciler = {
            "owner": lease.owner if lease else None, "lease_expires_at": lease.expires_at if lease else None,
            "report_at": report.at if report else None, "findings": dict(report.findings) if report else {},
            "details": list(report.details) if report else [], "repairs": dict(report.repairs) if report else {}}
    return {"healthy": not problems, "problems": problems, "kv": kv, "reconciler": reconciler}


async def _read(kv, key: str, rule):
    from phalanx_bus import read_one

    rec = await read_one(kv, key, rule)
    return getattr(rec, "value", rec)


def _stamp(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"


def render(r: dict[str, Any]) -> str:
    lines = ["KV values:"]
    for bucket, v in r["kv"].items():
        lines.append(f"  {bucket:<14} {v['ok']} ok, {len(v['bad'])} unreadable")
        lines += [f"    {bucket}/{b['key']} (revision {b['revision']}): {b['error']}" for b in v["bad"]]
    rec = r["reconciler"]
    if rec is None:
        lines.append("Reconciler:  - (no lease, no report)")
    else:
        lines.append(f"Reconciler:  lease {rec['owner'] or '-'} until {_stamp(rec['lease_expires_at'])}, "
                     f"last pass {_stamp(rec['report_at'])}")
        found = {k: n for k, n in rec["findings"].items() if n}
        lines.append("  findings:  " + (", ".join(f"{k} {n}" for k, n in sorted(found.items())) or "none"))
        lines += [f"    {d}" for d in rec["details"]]
    lines.append("Verdict:     healthy" if r["healthy"] else f"Verdict:     {len(r['problems'])} problem(s)")
    lines += [f"  - {p}" for p in r["problems"]]
    return "\n".join(lines)

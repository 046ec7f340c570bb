"""``phalanx explain NAMESPACE/POD``: why a pod is where it is, or why it is still pending.

It reads only what the services recorded: the pod (from the simulated cluster or, with
``--cluster kube``, the API server), its gang's saga state in KV ``phx-gangs`` (found by
member), the pod's Events, and the trace id of the gang's attempt. The output is a few labelled
lines, or one JSON document with ``--json``:

    {"pod": {"namespace", "name", "uid", "scheduler_name", "node"}, "status": "bound" | "pending",
     "managed": bool, "gang": {"id", "phase", "attempt", "failures", "min_member", "max_member", "members", "bound", "queue"} | null,
     "reason": str, "assignment": {...} | null, "condition": {...} | null, "trace_id": str | null,
     "trace_url": str | null, "events": [{"type", "reason", "message", "count", "at"}],
     "unreadable_records": [str], "whatif": {"answers": [{"probe", "text", "starts", ...}], "cut": [str]} | null,
     "preempting": {"victims": [{"gang", "rule"}], "nodes": [str], "until": float} | null,
     "repair": {"text", "failed": [{"pod", "node", "signal", "detail"}], "domain": str | null, "policy",
                "started_at", "deadline_at", "attempts", "restart"} | null,
     "claims": [{"name", "claim", "state", "detail", "reserved_for", "devices": [{"request", "device"}]}] | null}

``repair``: the gang lost members while it ran and is being repaired inside its domain
(docs/repair.md): the failed members, where their replacements go, the policy and the deadline;
null when it is not. The text form says it on a ``Repair:`` line.

``claims``: the pod's ResourceClaims (docs/dra.md) — each ``allocated`` (to which devices, reserved
for which pods), ``unallocated``, ``not created yet`` (a template's claim the resourceclaim
controller has not made), ``absent`` or ``invalid`` (the field and the rule); null for a pod
without claims. The text form lists them under ``Claims:``.

``whatif``: what would start a pending gang (``phalanx_engine.whatif``, docs/whatif.md), when
its record carries the answers (a ``whatif`` field of the gang record, ``phalanx_proto.whatif.WhatIf``);
null otherwise. The text form lists them under ``What if:``, the first that starts the gang first.

``preempting``: the victims a pending gang's nominations in ``phx-ledger`` name (docs/preemption.md),
each with the rule that allows it, the nodes where its GPUs are kept and until when; null when the
gang holds no nomination in force.

A gang record in ``phx-gangs`` that cannot be read is skipped and listed in
``unreadable_records`` (``phalanx doctor`` lists every bucket); every other pod is explained.

``reason`` is the gang's last reason (placement's kube-scheduler style summary) while the pod
is pending. Without a gang, it is the pod's ``PodScheduled`` message (for example, an invalid
request), or it says that the pod is not Phalanx's or has not been seen yet.

Exit codes: 0 explained, 1 no such pod, 2 bad argument or the bus/cluster cannot be reached:
connecting and every read together have ``--timeout`` seconds, then one line says what did not
answer. Text from the cluster (names, reasons, event messages) is printed with control
characters escaped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

import anyio
import msgspec

from phalanx_cli.cmd_run import add_cluster, add_nats, bus_auth, connect_bus, one_line, open_cluster
from phalanx_cli.terminal import safe, safe_lines
from phalanx_rules import repair as repairs


def register(sub) -> None:
    p = sub.add_parser("explain", help="why a pod is placed where it is, or why it is pending",
                       description="Show a pod's gang, saga phase and attempt, the last reason, its assignment, "
                                   "its events and the trace id of its gang's attempt.")
    p.add_argument("pod", metavar="NAMESPACE/POD", help="the pod (namespace 'default' when omitted)")
    add_nats(p)
    add_cluster(p)
    p.add_argument("--traces-url", default=os.environ.get("PHALANX_TRACES_URL", ""),
                   help="Jaeger UI base URL, to print a link to the trace (env PHALANX_TRACES_URL)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds for connecting to NATS and every read together (default %(default)s)")
    p.set_defaults(func=run)


def parse_ref(text: str) -> tuple[str, str]:
    ns, sep, name = text.partition("/")
    if not sep:
        ns, name = "default", text
    if not ns or not name or "/" in name:
        raise ValueError(f"{text!r}: expected NAMESPACE/POD")
    return ns, name


def run(args: argparse.Namespace) -> int:
    try:
        ns, name = parse_ref(args.pod)
    except ValueError as e:
        print(f"phalanx explain: {e}", file=sys.stderr)
        return 2
    try:
        report = anyio.run(_bounded, args, ns, name)
    except Exception as e:  # noqa: BLE001 - unreachable bus or cluster: say so, exit 2
        print(safe(f"phalanx explain: {one_line(e)}"), file=sys.stderr)
        return 2
    if report is None:
        print(safe(f"phalanx explain: pod {ns}/{name} not found"), file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else safe_lines(render(report)))
    return 0


async def _bounded(args: argparse.Namespace, namespace: str, name: str) -> dict[str, Any] | None:
    """``gather`` within ``--timeout`` seconds in all; the error says whether NATS was reached."""
    progress: dict[str, bool] = {}
    try:
        with anyio.fail_after(args.timeout):
            return await gather(args, namespace, name, progress=progress)
    except TimeoutError:
        what = "no answer from" if progress.get("connected") else "cannot reach"
        raise TimeoutError(f"{what} NATS at {args.nats} within {args.timeout:g}s") from None


async def gather(args: argparse.Namespace, namespace: str, name: str,
                 progress: dict[str, bool] | None = None) -> dict[str, Any] | None:
    """The report for one pod, or None when the pod does not exist. ``progress["connected"]``
    is set once NATS answered."""
    from phalanx_bus import read_all
    from phalanx_proto import subjects as S
    from phalanx_proto.events import PodRef
    from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION, SCHEDULER_NAMES
    from phalanx_proto.state import alloc_key

    async with AsyncExitStack() as stack:
        bus = await connect_bus(args.nats, service="cli", budget_s=args.timeout, auth=bus_auth(args))
        stack.push_async_callback(bus.close)
        if progress is not None:
            progress["connected"] = True
        cluster = await open_cluster(args.cluster, bus, kubeconfig=args.kubeconfig, stack=stack,
                                     qps=args.kube_api_qps, burst=args.kube_api_burst)
        ref = PodRef(namespace=namespace, name=name)
        pod = await cluster.get_pod(ref)
        if pod is None:
            return None
        events = await cluster.list_events(ref)
        state = None
        good, bad = await read_all(await bus.kv(S.KV_GANGS))
        for record in good:
            candidate = record.value
            members = [m.pod for m in candidate.members if m.pod.namespace == namespace and m.pod.name == name]
            if members and (state is None or any(m.uid == pod.uid for m in members)):
                state = candidate

        claims = await _claims_read(cluster, namespace, pod.raw)
        assignment = preempting = None
        if state is not None and not pod.node_name:  # reserved, not bound yet: the ledger holds it
            ledgers, _ = await read_all(await bus.kv(S.KV_LEDGER), pattern="*")
            key = alloc_key(PodRef(namespace=namespace, name=name, uid=pod.uid))
            assignment = next((r.value.allocations[key].assignment for r in ledgers
                               if key in r.value.allocations and r.value.allocations[key].gang_id == state.gang_id),
                              None)
            preempting = preempting_doc([r.value for r in ledgers], state.gang_id, time.time())

    condition = next((c for c in (pod.raw.get("status") or {}).get("conditions") or []
                      if c.get("type") == "PodScheduled"), None)
    assignment_doc = msgspec.to_builtins(assignment) if assignment is not None else None
    if assignment_doc is None and pod.annotations.get(ASSIGNMENT_ANNOTATION):
        try:
            assignment_doc = json.loads(pod.annotations[ASSIGNMENT_ANNOTATION])
        except ValueError:
            assignment_doc = {"raw": pod.annotations[ASSIGNMENT_ANNOTATION]}

    managed = pod.scheduler_name in SCHEDULER_NAMES
    if pod.node_name:
        reason = ""
    elif state is not None and state.reason:
        reason = state.reason
    elif condition is not None and condition.get("status") == "False" and condition.get("message"):
        reason = condition["message"]
    elif not managed:
        reason = f"not scheduled by phalanx (schedulerName {pod.scheduler_name!r})"
    elif state is None:
        reason = "not seen by gang-coordinator yet"
    elif state.phase in ("placing", "preempting") and assignment is not None:
        reason = f"gang placed: reserved on {assignment.node}, being bound"  # the binds go out from placing
    else:
        reason = f"gang {state.phase}"
    trace_id = state.trace_id if state is not None and state.trace_id else None
    whatif = whatif_doc(state) if state is not None and not pod.node_name else None
    base = args.traces_url.rstrip("/")
    return {
        "pod": {"namespace": namespace, "name": name, "uid": pod.uid, "scheduler_name": pod.scheduler_name,
                "node": pod.node_name or None},
        "status": "bound" if pod.node_name else "pending",
        "managed": managed,
        "gang": None if state is None else {
            "id": state.gang_id, "phase": state.phase, "attempt": state.attempt, "failures": state.failures,
            "min_member": state.min_member, "max_member": state.max_member or None,
            "members": [str(m.pod) for m in state.members],
            "bound": [str(b) for b in state.bound],
            "queue": next((m.queue for m in state.members if m.queue), "default")},
        "reason": reason,
        "assignment": assignment_doc,
        "condition": condition,
        "trace_id": trace_id,
        "trace_url": f"{base}/trace/{trace_id}" if trace_id and base else None,
        "events": [{"type": e.type, "reason": e.reason, "message": e.message, "count": e.count, "at": e.at}
                   for e in events],
        "unreadable_records": [str(b) for b in bad],
        "whatif": whatif,
        "preempting": preempting,
        "repair": repair_doc(state, time.time()),
        "claims": claims_doc(pod.raw, claims),
    }


async def _claims_read(cluster: Any, namespace: str, pod_raw: Any) -> dict[str, Any]:
    """The ResourceClaims the pod names (``spec.resourceClaims``, and the claim Phalanx made for
    its extended resources), read from the cluster: name -> the object, or None when absent."""
    from phalanx_kube.port import ClaimRef
    from phalanx_kubeobjects import dra as kdra

    named = kdra.pod_claims(pod_raw)
    names = [c for _, c in named if isinstance(c, str)] if isinstance(named, list) else []
    extended = ((pod_raw.get("status") or {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if extended:
        names.append(extended)
    return {n: await cluster.get_resource_claim(ClaimRef(namespace=namespace, name=n)) for n in dict.fromkeys(names)}


def claims_doc(pod_raw: Any, claims: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Each of the pod's claims (docs/dra.md): its ResourceClaim, whether it is allocated, to
    which devices (driver/pool/device, per request) and for which pods it is reserved — or why
    there is nothing to show (not created yet, absent, a field that breaks the API's rules).
    None for a pod with no claims."""
    from phalanx_kubeobjects import dra as kdra
    from phalanx_kubeobjects.violations import Violation

    named = kdra.pod_claims(pod_raw)
    if isinstance(named, Violation):
        return [{"name": "-", "claim": None, "state": "invalid", "detail": str(named)}]
    entries: list[tuple[str, str | None | kdra.Waiting]] = list(named)
    extended = ((pod_raw.get("status") or {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if extended:
        entries.append(("(extended resources)", extended))
    if not entries:
        return None
    out = []
    for name, claim in entries:
        if isinstance(claim, kdra.Waiting):
            out.append({"name": name, "claim": None, "state": "not created yet", "detail": claim.reason})
            continue
        if claim is None:
            out.append({"name": name, "claim": None, "state": "not needed", "detail": ""})
            continue
        obj = claims.get(claim)
        if obj is None:
            out.append({"name": name, "claim": claim, "state": "absent", "detail": "no such ResourceClaim"})
            continue
        allocation = kdra.allocation_of(obj)
        reserved = [f"{r.get('resource')}/{r.get('name')}" for r in (obj.get("status") or {}).get("reservedFor") or []
                    if isinstance(r, dict)]
        if isinstance(allocation, Violation):
            out.append({"name": name, "claim": claim, "state": "invalid", "detail": str(allocation),
                        "reserved_for": reserved})
        elif allocation is None:
            out.append({"name": name, "claim": claim, "state": "unallocated", "detail": "", "reserved_for": reserved})
        else:
            out.append({"name": name, "claim": claim, "state": "allocated", "detail": "", "reserved_for": reserved,
                        "devices": [{"request": d.request, "device": f"{d.driver}/{d.pool}/{d.device}"}
                                    for d in allocation.devices]})
    return out


def repair_doc(state: Any, now: float) -> dict[str, Any] | None:
    """The gang's repair under way, as JSON (module docstring), or None."""
    r = getattr(state, "repair", None)
    if r is None:
        return None
    d = r.domain()
    return {"text": repairs.describe(r, now), "domain": f"{d.tier} {d.domain}" if d is not None else None,
            "failed": [{"pod": str(f.pod), "node": f.node, "signal": f.signal, "detail": f.detail} for f in r.failed],
            "policy": r.policy, "started_at": r.started_at, "deadline_at": r.deadline_at, "attempts": r.attempts,
            "restart": r.restart}


def preempting_doc(ledgers: list, gang_id: str, now: float) -> dict[str, Any] | None:
    """The nominations in force the ledgers hold for ``gang_id``, as JSON (module docstring)."""
    noms = [n for led in ledgers for n in getattr(led, "nominations", {}).values()
            if n.gang_id == gang_id and n.active(now)]
    if not noms:
        return None
    victims = {g: rule for n in noms for g, rule in n.victims.items()}
    return {"victims": [{"gang": g, "rule": rule} for g, rule in sorted(victims.items())],
            "nodes": sorted({n.assignment.node for n in noms}), "until": min(n.expires_at for n in noms)}


def whatif_doc(state: Any) -> dict[str, Any] | None:
    """The counterfactual answers a gang record carries, as JSON (None when it carries none:
    records written before placement computed them, or a gang that is not pending)."""
    whatif = getattr(state, "whatif", None)
    if whatif is None or not getattr(whatif, "answers", None):
        return None
    return msgspec.json.decode(msgspec.json.encode(whatif))


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"


def render(r: dict[str, Any]) -> str:
    pod = r["pod"]
    lines = [f"Pod:         {pod['namespace']}/{pod['name']}  (uid {pod['uid'] or '-'}, "
             f"schedulerName {pod['scheduler_name']})"]
    lines.append(f"Status:      bound to {pod['node']}" if r["status"] == "bound" else "Status:      pending")
    g = r["gang"]
    if g is None:
        lines.append("Gang:        -")
    else:
        lines.append(f"Gang:        {g['id']}  phase {g['phase']}, attempt {g['attempt']} ({g['failures']} failed), "
                     f"{len(g['members'])} member(s) (min {g['min_member']}"
                     f"{', elastic up to ' + str(g['max_member']) if g.get('max_member') else ''}), {len(g['bound'])} bound, "
                     f"queue {g['queue']}")
    lines.append(f"Reason:      {r['reason'] or '-'}")
    if r.get("repair"):
        lines.append(f"Repair:      {r['repair']['text']}")
    answers = (r.get("whatif") or {}).get("answers") or []
    if answers:
        lines.append("What if:")
        lines += [f"  {a['text']}" + ("" if a.get("starts", True) else " (not enough alone)") for a in answers]
        if r["whatif"].get("cut"):
            lines.append(f"  (out of time before: {', '.join(r['whatif']['cut'])})")
    p = r.get("preempting")
    if p:
        victims = ", ".join(f"{v['gang']} ({v['rule']})" for v in p["victims"])
        lines.append(f"Preempting:  {victims}; GPUs kept on {', '.join(p['nodes'])} until {_stamp(p['until'])}")
    for c in r.get("claims") or []:
        head = f"  {c['name']}" + (f" (claim {c['claim']})" if c.get("claim") else "") + f": {c['state']}"
        if c.get("devices"):
            head += " to " + ", ".join(f"{d['device']} ({d['request']})" for d in c["devices"])
        if c.get("reserved_for"):
            head += f"; reserved for {', '.join(c['reserved_for'])}"
        if c.get("detail"):
            head += f" — {c['detail']}"
        if c is r["claims"][0]:
            lines.append("Claims:")
        lines.append(head)
    a = r["assignment"]
    if a:
        parts = [f"node {a.get('node', '-')}", f"GPUs {','.join(map(str, a.get('gpus') or [])) or '-'}"]
        if a.get("core_pct") or a.get("memory_mib"):
            parts.append(f"share {a.get('core_pct', 0)}% / {a.get('memory_mib', 0)} MiB per GPU")
        if a.get("mig_profile"):
            parts.append(f"MIG {a['mig_profile']}")
        if a.get("nics"):
            parts.append(f"NICs {','.join(a['nics'])} ({a.get('rdma_level') or '-'})")
        lines.append(f"Assignment:  {', '.join(parts)}")
    else:
        lines.append("Assignment:  -")
    c = r["condition"]
    if c:
        text = f"PodScheduled={c.get('status')} {c.get('reason', '')}"
        lines.append(f"Condition:   {text}: {c['message']}" if c.get("message") else f"Condition:   {text}")
    trace = r["trace_id"] or "-"
    lines.append(f"Trace:       {trace}" + (f"  {r['trace_url']}" if r["trace_url"] else ""))
    if r.get("unreadable_records"):
        lines.append(f"Records:     {len(r['unreadable_records'])} gang record(s) in phx-gangs cannot be read and were "
                     "skipped (see `phalanx doctor`)")
    lines.append("Events:" if r["events"] else "Events:      -")
    for e in r["events"]:
        count = f" (x{e['count']})" if e["count"] > 1 else ""
        lines.append(f"  {_stamp(e['at'])}  {e['type']:<7}  {e['reason']}{count}: {e['message']}")
    return "\n".join(lines)

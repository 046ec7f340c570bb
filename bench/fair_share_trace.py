"""Fair share that remembers, on the Alibaba trace (docs/queues.md, "Measured on the trace").

Runs ``phalanx sim`` twice on the same seeded workload — the trace's pods at ``--load`` of the
cluster, team-a submitting from the start and team-b only from ``--b-from`` on (a team that
held the cluster all night, and one that had nothing) — once with the plain fair share and
once with the queues' recent usage weighing it (``--usage-half-life``), and prints per window
of virtual time, per queue: the GPUs held and the fair share (means of the samples), and the
wait of the gangs that arrived in the window (p50/p90; a gang that never started waits until
the end of the run).

    .venv/bin/python bench/fair_share_trace.py --synthetic 64x8v100 --load 1.2 --duration 36h \\
        --b-from 16h --weights 3,1 --usage-half-life 2h --windows 0,16h,18h,20h,24h,28h,36h
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUEUE = """\
apiVersion: scheduling.phalanx.io/v1alpha1
kind: Queue
metadata: {{name: {name}}}
spec: {{resources: {{nvidia.com/gpu: {{quota: 0, overQuotaWeight: {weight}}}}}}}
"""
PHALANX = str(Path(sys.executable).with_name("phalanx"))


def seconds(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)


def run(args: argparse.Namespace, queues: str, half_life: str | None) -> tuple[dict, float]:
    cmd = [PHALANX, "sim", "--synthetic", args.synthetic, "--trace", "--load", str(args.load), "--seed", str(args.seed),
           "--trace-queues", f"team-a,team-b@{args.b_from}", "--queues", queues, "--duration", args.duration,
           "--json", "--gangs", "all", "--pending", "0", "--quiet"]
    if half_life:
        cmd += ["--usage-half-life", half_life]
    started = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out), time.perf_counter() - started


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] if values else 0.0


def windows(doc: dict, edges: list[float]) -> list[dict]:
    end = edges[-1]
    rows = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        samples = [s for s in doc["samples"] if lo <= s["t"] < hi]
        for q in ("team-a", "team-b"):
            held = [s["queues"][q]["held_gpus"] for s in samples]
            share = [s["queues"][q]["fair_share_gpus"] for s in samples]
            waits = [(g["wait_s"] if g["wait_s"] is not None else end - g["arrival_s"])
                     for g in doc["gangs"] if g["queue"] == q and lo <= g["arrival_s"] < hi]
            rows.append({"window": f"{lo / 3600:g}-{hi / 3600:g}h", "queue": q,
                         "held": sum(held) / len(held) if held else 0.0,
                         "share": sum(share) / len(share) if share else 0.0, "gangs": len(waits),
                         "p50": pct(waits, 0.5), "p90": pct(waits, 0.9)})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--synthetic", default="64x8v100")
    p.add_argument("--load", type=float, default=1.2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--duration", default="24h")
    p.add_argument("--b-from", default="8h")
    p.add_argument("--usage-half-life", default="2h")
    p.add_argument("--weights", default="1,1", help="overQuotaWeight of team-a and team-b")
    p.add_argument("--windows", default="0,8h,10h,12h,16h,24h", help="window edges")
    args = p.parse_args()
    edges = [seconds(e) if e != "0" else 0.0 for e in args.windows.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        queues = str(Path(tmp) / "queues.yaml")
        wa, wb = args.weights.split(",")
        Path(queues).write_text(QUEUE.format(name="team-a", weight=wa) + "---\n" + QUEUE.format(name="team-b", weight=wb))
        plain, plain_s = run(args, queues, None)
        remembers, rem_s = run(args, queues, args.usage_half_life)
    print(f"{args.synthetic}, trace at load {args.load:g} (seed {args.seed}), {args.duration}; team-a from 0, "
          f"team-b from {args.b_from}; quota 0, weights {args.weights}")
    print(f"wall time: plain {plain_s:.1f} s, with half-life {args.usage_half_life} {rem_s:.1f} s")
    head = (f"{'window':>9} {'queue':<7} | {'held':>7} {'share':>7} {'wait p50':>9} {'p90':>8} | "
            f"{'held':>7} {'share':>7} {'wait p50':>9} {'p90':>8} {'gangs':>6}")
    print(f"{'':>17} | {'plain fair share':^34} | {'half-life ' + args.usage_half_life:^41}")
    print(head)
    for a, b in zip(windows(plain, edges), windows(remembers, edges), strict=True):
        print(f"{a['window']:>9} {a['queue']:<7} | {a['held']:7.1f} {a['share']:7.1f} {a['p50']:8.0f}s {a['p90']:7.0f}s"
              f" | {b['held']:7.1f} {b['share']:7.1f} {b['p50']:8.0f}s {b['p90']:7.0f}s {a['gangs']:6d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

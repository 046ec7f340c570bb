"""The DRA agreement table: kube-scheduler and Phalanx given the same ResourceClaims on one real
kube-apiserver (issue 38), as ``tests/e2e/test_dra_agreement.py`` runs it, written as a report.

A fresh control plane (etcd, kube-apiserver v1.36.3, kwok, kube-scheduler, kube-controller-manager
with its resourceclaim controller; tests/kube/kubeharness.py, kubecontrollers.py), twin pools of
two DGX-1V-shaped kwok nodes each with NVIDIA-shaped ResourceSlices, and the whole Phalanx stack
serving one pool (tests/kube/draagreement.py). Every single-pod case runs on both schedulers at
once; then the two gangs, on each. It prints the table (Markdown) and, with ``--write``, writes
the report with the command, the commit and the date.

    .venv/bin/python bench/dra_agreement.py                          # prints; ~2 min on 2 cores
    .venv/bin/python bench/dra_agreement.py --write docs/dra-agreement.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "kube"))

import draagreement as da  # noqa: E402
import kubecontrollers  # noqa: E402
import kubeharness  # noqa: E402

COMMAND = ".venv/bin/python bench/dra_agreement.py --write docs/dra-agreement.md"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def commit(written: str | None) -> str:
    """The commit run, ``-dirty`` when a tracked file other than the report differs from it."""
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    spec = ["--", "."] + ([f":(exclude){Path(written).resolve().relative_to(REPO)}"] if written else [])
    return rev + ("-dirty" if git("status", "--porcelain", "--untracked-files=no", *spec) else "")


def summary(rows: Sequence[da.Row]) -> list[str]:
    agree = [r for r in rows if r.outcomes[da.UPSTREAM].fits == r.outcomes[da.PHALANX].fits]
    both = [r for r in rows if all(o.fits for o in r.outcomes.values()) and r.scores[da.UPSTREAM]]
    better = [r for r in both if r.scores[da.PHALANX] and
              da.score_key(r.scores[da.PHALANX]) > da.score_key(r.scores[da.UPSTREAM])]
    worse = [r for r in both if r.scores[da.PHALANX] and
             da.score_key(r.scores[da.PHALANX]) < da.score_key(r.scores[da.UPSTREAM])]
    broken = [(r.case.name, side, p) for r in rows for side, ps in r.problems.items() for p in ps]
    up_fit = sum(r.outcomes[da.UPSTREAM].fits for r in rows)
    phx_fit = sum(r.outcomes[da.PHALANX].fits for r in rows)
    lines = [f"* Cases: {len(rows)}; kube-scheduler scheduled {up_fit} and left {len(rows) - up_fit} pending; "
             f"Phalanx scheduled {phx_fit} and left {len(rows) - phx_fit} pending.",
             f"* Phalanx agreed on whether the pod fits in {len(agree)} of {len(rows)}.",
             f"* Where both scheduled a GPU set ({len(both)}): Phalanx's better connected in {len(better)}, "
             f"as well connected in {len(both) - len(better) - len(worse)}, worse in {len(worse)}."]
    lines.append("* Allocations breaking a rule (checked against the published devices): "
                 + ("none." if not broken else "; ".join(f"{c} ({s}): {p}" for c, s, p in broken)))
    return lines


def report(rows: Sequence[da.Row], gangs: Sequence[da.GangRun], seconds: float, written: str | None = None) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join([
        "# DRA: agreement with kube-scheduler",
        "",
        "The same ResourceClaims given to kube-scheduler and to Phalanx on one real kube-apiserver (issue 38).",
        "How the cluster and the cases are built: `tests/kube/draagreement.py`; the assertions:",
        "`tests/e2e/test_dra_agreement.py`; the devices: `phalanx_localstack.draslices` (shaped like",
        "NVIDIA's DRA driver; docs/dra.md).",
        "",
        "* **Cluster.** kube-apiserver, kube-scheduler and kube-controller-manager v1.36.3 (default feature",
        "  gates: DRA GA, prioritized list GA, device taints beta on), kwok. Kwok nodes shaped like a",
        "  DGX-1V (8 × V100-SXM2-16GB in the hybrid cube mesh, NVLink quads {0,1,2,3} and {4,5,6,7}; one",
        "  mlx5 NIC on GPU2/GPU3's PCIe switch), no device plugin (Phalanx's agents `--advertise none`),",
        f"  in {da.LANES} lanes of four: two `pool=upstream`, two `pool=phalanx`, each lane with its own",
        "  namespace; the lanes run cases at once, a case at a time each.",
        "  Each node publishes a `gpu.nvidia.com` pool (GPUs `gpu-0`…`gpu-7`) and a `rdma.example.com` pool",
        "  (`nic-0`); DeviceClasses `gpu.nvidia.com`, `mig.nvidia.com`, `rdma.example.com`.",
        "* **A case.** One claim for a pod of `schedulerName: default-scheduler` pinned to the upstream pool,",
        "  the same claim for a pod of `schedulerName: phalanx` pinned to the Phalanx pool, both at once;",
        "  a pod counts as left pending once it has said `Unschedulable` for 8 s. Devices \"held by another",
        "  claim\" are claims of pods pinned to each node and allocated by kube-scheduler, in both pools,",
        "  a second before the case's pods come. (A run that created them the moment the blockers were",
        "  bound once saw Phalanx allocate GPUs a blocker held, in \"three GPUs when another claim holds",
        "  five\": its view of claims other schedulers allocate lagged the API. Eight more runs of the",
        "  two cases that fit did not repeat it.)",
        "  Taints are put on the published devices of the lane's nodes (a new pool generation).",
        "* **Links.** `phalanx_engine.gpuset.score_set` on the node's topology: the ring bottleneck over",
        "  the GPUs (NVLink > PCIe) and the NVLinks summed over their pairs.",
        "",
        f"Run: `{COMMAND}` at commit `{commit(written)}`, {when}, {os.cpu_count()} CPUs, {seconds:.0f} s.",
        "",
        "## Single pods",
        "",
        da.table(rows),
        "",
        *summary(rows),
        "",
        "Why pods were left pending (each scheduler's `PodScheduled` message):",
        "",
        da.reasons(rows),
        "",
        "## Gangs",
        "",
        "kube-scheduler 1.36.3 has no gang scheduling by default (its GangScheduling and GenericWorkload",
        "gates are alpha, off) and these pods name no PodGroup: it places the members one by one and",
        "never revisits a member's devices (kubernetes#138765: its alpha gang plugin has the same gap).",
        "",
        "* **halves**: two pods of 4 GPUs each (a claim each), both pinned to one node, one gang of two:",
        "  the node's two halves.",
        "* **halves-prefer-whole**: the same, each claim preferring the whole node (`firstAvailable`: 8,",
        "  else 4), kubernetes#138765 on GPUs. Both run only as two halves; given pod by pod, the first",
        "  pod takes all 8.",
        "* **backtrack**: a trainer of 4 GPUs and a feeder of 2 GPUs plus the NIC on their PCIe root",
        "  (`matchAttribute: resource.kubernetes.io/pcieRoot`; only GPU2 and GPU3 share the NIC's root),",
        "  both pinned to one node. kube-scheduler is given the trainer first and the feeder once the",
        "  trainer is bound, as it would schedule them; Phalanx is given both as one gang.",
        "",
        da.gang_lines(gangs),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", metavar="PATH", help="write the report (Markdown) there")
    ap.add_argument("--cases", metavar="SUBSTRING", default="", help="only the cases whose name contains this")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    plane = kubeharness.start_control_plane()
    work = tempfile.TemporaryDirectory(prefix="dra-agreement-")
    cluster = None
    try:
        kubeharness.apply_crds(plane, [d for f in sorted(kubeharness.PHALANX_CRDS.glob("*.yaml"))
                                       for d in yaml.safe_load_all(f.read_text()) if d])
        kubecontrollers.ensure_controller_manager(plane)
        plane.start_scheduler()
        cluster = da.make_cluster(plane)
        say(f"control plane and pools ready ({time.monotonic() - t0:.0f}s); starting Phalanx")
        da.start_phalanx(cluster, Path(work.name))
        rows = da.run_cases(cluster, [c for c in da.CASES if args.cases in c.name], lambda r: say(
            f"{r.case.name}: upstream {da.fits_text(r.outcomes[da.UPSTREAM])}, "
            f"phalanx {da.fits_text(r.outcomes[da.PHALANX])} ({r.seconds:.1f}s)"))
        gangs = [run(cluster, side) for run in (da.run_gang_halves, da.run_gang_halves_preferring_whole,
                                                da.run_gang_backtrack) for side in (da.UPSTREAM, da.PHALANX)]
    finally:
        if cluster is not None and cluster.stack is not None:
            cluster.stack.stop()
        plane.stop()
        work.cleanup()
    text = report(rows, gangs, time.monotonic() - t0, args.write)
    print(text)
    if args.write:
        Path(args.write).write_text(text)
        say(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The table and the plot of ``bench/scale.py``'s results (its rows, one per nodes × workload ×
scheduler): pods/s, pending→bound latency, gang latency and CPU per pod side by side, the ratios
between the schedulers, the API server's requests and watch events per pod, the cost of quota, and the share and preempt workloads' own tables
(``queue_share.share_table``, ``preempt_kwok.table``).
"""

from __future__ import annotations

import math

import preempt_kwok
from kwokbench import pyplot_or_exit
from queue_share import share_table


def _secs(v: float, cap: float) -> str:
    return f">{cap:.0f} s" if math.isinf(v) else (f"{v * 1000:.0f} ms" if v < 10 else f"{v:.1f} s")


def table(rows: list[dict], small: dict | None = None) -> str:
    shares = [share_table(r["share"], r["nodes"]) for r in rows if "share" in r]
    preempts = [{"nodes": r["nodes"], **r["preempt"]} for r in rows if "preempt" in r]
    if preempts:
        shares.append(preempt_kwok.table(preempts, small))
    rows = [r for r in rows if "share" not in r and "preempt" not in r]
    if not rows:
        return "\n\n".join(shares)
    out = [f"{'nodes':>6} {'workload':<8} {'scheduler':<15} {'bound':>11} {'pods/s':>8} {'p50':>9} {'p99':>9} "
           f"{'gang-8 p50':>11} {'gang-64 p50':>12} {'CPU s/pod':>10} {'agents':>8} {'apiserver+':>11} "
           f"{'plc RSS':>8}", "-" * 136]
    for r in rows:
        per_pod = {g: c / max(1, r["bound"]) for g, c in r["cpu_s"].items()}
        gangs = r["gang_p50_s"]
        out.append(
            f"{r['nodes']:>6} {r['workload']:<8} {('Phalanx' if r['scheduler'] == 'phalanx' else 'kube-scheduler'):<15} "
            f"{r['bound']:>5}/{r['pods']:<5} {r['pods_per_s']:>8.1f} {_secs(r['p50_s'], r['cap_s']):>9} "
            f"{_secs(r['p99_s'], r['cap_s']):>9} "
            f"{(_secs(gangs[8], r['cap_s']) if 8 in gangs else '-'):>11} "
            f"{(_secs(gangs[64], r['cap_s']) if 64 in gangs else '-'):>12} "
            f"{per_pod['scheduler']:>10.4f} {per_pod.get('node agents', 0):>8.4f} {per_pod['control plane']:>11.4f} "
            f"{(str(round(r['placement_rss_mib'])) + ' MiB') if 'placement_rss_mib' in r else '-':>8}")
    pairs = {}
    for r in rows:
        pairs.setdefault((r["nodes"], r["workload"]), {})[r["scheduler"]] = r
    ratios = [f"Phalanx / kube-scheduler pods/s at {n} nodes, {w}: "
              f"{p['phalanx']['pods_per_s'] / p['default-scheduler']['pods_per_s']:.2f}"
              for (n, w), p in pairs.items() if len(p) == 2 and p["default-scheduler"]["pods_per_s"] > 0]
    costs = [f"Phalanx at {n} nodes, queues against gangs (the cost of quota): pods/s "
             f"{p['queues']['pods_per_s'] / p['gangs']['pods_per_s']:.2f}x, CPU s/pod "
             f"{_per_pod(p['queues']) / _per_pod(p['gangs']):.2f}x"
             for n, p in _by_workload(rows, "phalanx").items() if {"queues", "gangs"} <= p.keys()
             and p["gangs"]["pods_per_s"] > 0 and _per_pod(p["gangs"]) > 0]
    split = [f"{r['nodes']} nodes {r['workload']}: Phalanx CPU s/pod by process: " + ", ".join(
        f"{g.strip()} {c / max(1, r['bound']):.4f}" for g, c in r["cpu_s"].items() if g.startswith("  "))
        for r in rows if r["scheduler"] == "phalanx"]
    served = [f"{r['nodes']} nodes {r['workload']} {_name(r)}: API server per pod (every client's): " + ", ".join(
        f"{k} {v:g}" for k, v in sorted(r["api_per_pod"].items(), key=lambda kv: -kv[1]))
        for r in rows if r.get("api_per_pod")]
    return "\n".join(out + [""] + ratios + costs + split + served + [""] + shares)


def _name(r: dict) -> str:
    return "Phalanx" if r["scheduler"] == "phalanx" else "kube-scheduler"


def _per_pod(r: dict) -> float:
    return r["cpu_s"]["scheduler"] / max(1, r["bound"])


def _by_workload(rows: list[dict], scheduler: str) -> dict[int, dict[str, dict]]:
    out: dict[int, dict[str, dict]] = {}
    for r in rows:
        if r["scheduler"] == scheduler:
            out.setdefault(r["nodes"], {})[r["workload"]] = r
    return out


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot_or_exit()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for scheduler, name, color in (("phalanx", "Phalanx", "tab:blue"), ("default-scheduler", "kube-scheduler",
                                                                           "tab:orange")):
        mine = sorted((r for r in rows if r["scheduler"] == scheduler and r["workload"] == "single" and "share" not in r),
                      key=lambda r: r["nodes"])
        for key, style in (("p50_s", "-o"), ("p99_s", "--s")):
            pts = [(r["nodes"], r[key]) for r in mine if math.isfinite(r[key])]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, color=color, label=f"{name} {key[:3]}")
    ax.set(xscale="log", yscale="log", xlabel="nodes (8 GPUs each)", ylabel="pending→bound (s)",
           title="One-GPU pods on kwok nodes, same kube-apiserver")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)

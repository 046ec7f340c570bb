"""``phalanx sim --plot DIR``: three figures of a run, drawn with matplotlib (the ``plot``
extra, which ``make install`` installs): GPU utilisation and stranded GPUs over time
(``utilisation.png``), each queue's GPUs held against its fair share over time
(``queue_shares.png``, when there is more than the default queue), and each queue's wait
times as a distribution (``waits.png``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: .venv/bin/pip install -e '.[plot]' (make install does)") from None
    return plt


def _scale(seconds: float) -> tuple[float, str]:
    if seconds >= 2 * 86400:
        return 86400.0, "days"
    if seconds >= 2 * 3600:
        return 3600.0, "hours"
    return 60.0, "minutes"


def draw(doc: dict[str, Any], out: Path, title: str) -> list[Path]:
    """Write the figures of ``doc`` (``report.document``) into ``out``; returns their paths."""
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    samples, gpus = doc["samples"], doc["summary"]["gpus"] or 1
    unit, label = _scale(doc["summary"]["virtual_s"])
    xs = [s["t"] / unit for s in samples]
    written = []

    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.plot(xs, [100 * s["allocated_gpus"] / gpus for s in samples], label="GPUs allocated")
    ax.plot(xs, [100 * s["stranded_gpus"] / gpus for s in samples], label="GPUs stranded (free, no CPU to feed them)")
    ax.set(xlabel=f"virtual time ({label})", ylabel="% of the cluster's GPUs", ylim=(0, 105), title=title)
    twin = ax.twinx()
    twin.plot(xs, [s["pending"] for s in samples], color="grey", linestyle=":", label="gangs pending")
    twin.set_ylabel("gangs pending")
    lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(lines, [x.get_label() for x in lines], loc="lower right", fontsize=8)
    written.append(_save(fig, out / "utilisation.png", plt))

    queues = [q for q in doc["summary"]["queues"] if q != "default" or len(doc["summary"]["queues"]) == 1]
    if len(doc["summary"]["queues"]) > 1:
        fig, ax = plt.subplots(figsize=(8, 4.2))
        for i, q in enumerate(queues):
            color = f"C{i % 10}"
            ax.plot(xs, [s["queues"].get(q, {}).get("held_gpus", 0) for s in samples], color=color, label=f"{q} held")
            ax.plot(xs, [s["queues"].get(q, {}).get("fair_share_gpus", 0) for s in samples], color=color,
                    linestyle="--", label=f"{q} fair share")
        ax.set(xlabel=f"virtual time ({label})", ylabel="GPUs", title=f"{title}: queue shares")
        ax.legend(fontsize=8)
        written.append(_save(fig, out / "queue_shares.png", plt))

    fig, ax = plt.subplots(figsize=(8, 4.2))
    for q in doc["summary"]["queues"] or ["default"]:
        waits = sorted(max(1.0, r["wait_s"]) for r in doc["gangs"] if r["queue"] == q and r["wait_s"] is not None)
        if waits:
            ax.step(waits, [(i + 1) / len(waits) * 100 for i in range(len(waits))], where="post", label=q)
    ax.set_xscale("log")
    ax.set(xlabel="wait before start (seconds, log; under 1 s shown as 1 s)", ylabel="% of the queue's gangs started",
           ylim=(0, 101), title=f"{title}: waits")
    ax.legend(fontsize=8)
    written.append(_save(fig, out / "waits.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

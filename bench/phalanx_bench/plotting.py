"""Line plots for the benchmarks (``--plot FILE.png``), so every bench draws the same way.
Benchmark-only, like the rest of ``phalanx_bench`` (import-linter keeps it out of production).

``line_plot`` takes named series of (x, y) points and writes a PNG with matplotlib's Agg
backend (no display needed); ``pyplot`` hands a bench that draws its own figure (bars, several
axes) the same matplotlib, loaded the same way. matplotlib comes with the ``plot`` extra, which
``make install`` installs (``pip install -e '.[dev,plot]'``); without it both raise
``PlotUnavailable`` saying how to get it. ``line_plot`` is used by ``bench/packing.py``
(unallocated GPU against arrived demand) and meant for the scale benchmarks (latency against
nodes, one series per scheduler); ``pyplot`` by ``bench/scale.py``, ``bench/peers.py`` and
``bench/queue_share.py`` (through ``bench/kwokbench.py``)::

    from phalanx_bench.plotting import Series, line_plot
    line_plot("scale.png", [Series("Phalanx", nodes, p99_ms), Series("kube-scheduler", nodes, k8s_ms)],
              xlabel="nodes", ylabel="p99 latency (ms)", logx=True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


@dataclass(frozen=True)
class Series:
    """One line: its legend label, its points, and an optional matplotlib line style
    (``":"`` dotted, ``"--"`` dashed) and colour."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    style: str = "-"
    color: str | None = None
    marker: str | None = field(default=None)


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed), for a bench that draws its own
    figure; ``PlotUnavailable`` saying how to install it when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise PlotUnavailable("--plot needs matplotlib: run 'make install' (it installs the plot extra) or "
                              "'.venv/bin/pip install -e .[plot]'") from e
    return plt


def line_plot(path: str, series: Sequence[Series], *, xlabel: str, ylabel: str, title: str = "",
              ylim: tuple[float, float] | None = None, logx: bool = False, logy: bool = False,
              size: tuple[float, float] = (8, 4)) -> str:
    """Write the series as one PNG at ``path`` (120 dpi); returns ``path``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=size)
    try:
        for s in series:
            ax.plot(list(s.xs), list(s.ys), s.style, label=s.label, color=s.color, marker=s.marker)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        if ylim is not None:
            ax.set_ylim(*ylim)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.5)
        ax.legend()
        fig.savefig(path, bbox_inches="tight", dpi=120)
    finally:
        plt.close(fig)
    return path

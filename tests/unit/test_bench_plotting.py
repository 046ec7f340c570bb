"""``phalanx_bench.plotting``: the benchmarks' one way to draw ``--plot`` PNGs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from phalanx_bench.plotting import PlotUnavailable, Series, line_plot


def test_line_plot_writes_a_png_with_every_series(tmp_path: Path) -> None:
    path = tmp_path / "scale.png"
    series = [Series("Phalanx", [100, 1000, 5000], [2.0, 3.5, 9.0], marker="o"),
              Series("kube-scheduler", [100, 1000, 5000], [1.0, 4.0, 20.0], style="--")]
    assert line_plot(str(path), series, xlabel="nodes", ylabel="p99 latency (ms)", logx=True) == str(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_line_plot_says_how_to_install_matplotlib_when_it_is_missing(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotUnavailable, match="run 'make install' \\(it installs the plot extra\\)"):
        line_plot(str(tmp_path / "x.png"), [Series("a", [1], [1])], xlabel="x", ylabel="y")
    assert not (tmp_path / "x.png").exists()

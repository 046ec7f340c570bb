"""Prometheus metrics with no dependency beyond the standard library: Counter, Gauge, Histogram,
a ``Registry`` and the text exposition format (version 0.0.4). What Phalanx exports is declared
in ``phalanx_telemetry.metrics``.

Label sets are bounded: label names are fixed when a metric is declared, a label may list
its allowed values (anything else is recorded as ``other``), and a metric holds at most
``max_series`` label combinations; observations for further combinations are dropped and
counted in ``phalanx_metrics_dropped_series_total``. Pod names are never labels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

DEFAULT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""For pending→bound: seconds to minutes."""

FORBIDDEN_LABELS = frozenset({"pod", "pod_name", "k8s_pod_name", "uid", "gang", "gang_id"})
"""Unbounded identities: they go into logs and traces, never into labels."""

Labels = tuple[str, ...]


class MetricError(ValueError):
    """A metric was declared or used against its contract (bad name, unknown label)."""


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _valid_name(name: str) -> bool:
    return bool(name) and (name[0].isalpha() or name[0] in "_:") and all(c.isalnum() or c in "_:" for c in name)


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help: str, labels: Sequence[str] = (), *,
                 allowed: Mapping[str, Iterable[str]] | None = None, max_series: int = 1000,
                 registry: Registry | None = None) -> None:
        if not _valid_name(name):
            raise MetricError(f"invalid metric name {name!r}")
        bad = [lab for lab in labels if not _valid_name(lab) or lab.startswith("__") or lab == "le"]
        if bad:
            raise MetricError(f"{name}: invalid label name(s) {bad}")
        if FORBIDDEN_LABELS & set(labels):
            raise MetricError(f"{name}: label(s) {sorted(FORBIDDEN_LABELS & set(labels))} are unbounded identities")
        self.name = name
        self.help = help
        self.label_names: Labels = tuple(labels)
        self.allowed = {k: frozenset(v) for k, v in (allowed or {}).items()}
        unknown = set(self.allowed) - set(self.label_names)
        if unknown:
            raise MetricError(f"{name}: allowed values given for unknown label(s) {sorted(unknown)}")
        self.max_series = max_series
        self._registry = registry if registry is not None else REGISTRY
        self._registry.register(self)

    def _key(self, labels: Mapping[str, object]) -> Labels:
        if set(labels) != set(self.label_names):
            raise MetricError(f"{self.name}: labels {sorted(labels)} != declared {list(self.label_names)}")
        out = []
        for lab in self.label_names:
            value = str(labels[lab])
            allowed = self.allowed.get(lab)
            if allowed is not None and value not in allowed:
                value = "other"
            out.append(value)
        return tuple(out)

    def _admit(self, series: dict, key: Labels) -> bool:
        if key in series or len(series) < self.max_series:
            return True
        self._registry.dropped(self.name)
        return False

    def _label_text(self, key: Labels, extra: tuple[tuple[str, str], ...] = ()) -> str:
        pairs = [*zip(self.label_names, key, strict=True), *extra]
        if not pairs:
            return ""
        return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in pairs) + "}"

    def samples(self) -> list[str]:
        raise NotImplementedError

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}", *self.samples()]


class Counter(_Metric):
    """A monotonically increasing count. Names end in ``_total``."""

    kind = "counter"

    def __init__(self, name: str, help: str, labels: Sequence[str] = (), **kw) -> None:
        if not name.endswith("_total"):
            raise MetricError(f"counter {name!r} must end in _total")
        super().__init__(name, help, labels, **kw)
        self._values: dict[Labels, float] = {} if labels else {(): 0.0}

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        if amount < 0:
            raise MetricError(f"{self.name}: a counter only goes up (got {amount})")
        key = self._key(labels)
        if self._admit(self._values, key):
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: object) -> float:
        return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        return [f"{self.name}{self._label_text(k)} {_fmt(v)}" for k, v in sorted(self._values.items())]


class Gauge(_Metric):
    """A value that goes up and down. ``replace`` swaps the whole series set at once (for
    gauges recomputed from state, so a node that disappeared stops being reported)."""

    kind = "gauge"

    def __init__(self, name: str, help: str, labels: Sequence[str] = (), **kw) -> None:
        super().__init__(name, help, labels, **kw)
        self._values: dict[Labels, float] = {} if labels else {(): 0.0}

    def set(self, value: float, **labels: object) -> None:
        key = self._key(labels)
        if self._admit(self._values, key):
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        key = self._key(labels)
        if self._admit(self._values, key):
            self._values[key] = self._values.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: object) -> None:
        self.inc(-amount, **labels)

    def replace(self, values: Iterable[tuple[Mapping[str, object], float]]) -> None:
        """Set exactly these series (``(labels, value)`` pairs); every other series is dropped."""
        fresh: dict[Labels, float] = {}
        for labels, value in values:
            key = self._key(labels)
            if key in fresh or len(fresh) < self.max_series:
                fresh[key] = fresh.get(key, 0.0) + float(value)
            else:
                self._registry.dropped(self.name)
        self._values = fresh if (fresh or self.label_names) else {(): 0.0}

    def value(self, **labels: object) -> float:
        return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        return [f"{self.name}{self._label_text(k)} {_fmt(v)}" for k, v in sorted(self._values.items())]


class Histogram(_Metric):
    """Observations counted into cumulative ``le`` buckets, plus ``_sum`` and ``_count``.
    Names of durations end in ``_seconds``."""

    kind = "histogram"

    def __init__(self, name: str, help: str, labels: Sequence[str] = (), *,
                 buckets: Sequence[float] = DEFAULT_BUCKETS, **kw) -> None:
        super().__init__(name, help, labels, **kw)
        bounds = sorted(float(b) for b in buckets if not math.isinf(b))
        if not bounds or len(set(bounds)) != len(bounds):
            raise MetricError(f"{name}: buckets must be distinct and non-empty")
        self.buckets = (*bounds, math.inf)
        self._series: dict[Labels, list[float]] = {}
        """labels → [count per bucket (not cumulative)..., sum, count]."""
        if not labels:
            self._series[()] = [0.0] * (len(self.buckets) + 2)

    def observe(self, value: float, **labels: object) -> None:
        key = self._key(labels)
        if not self._admit(self._series, key):
            return
        row = self._series.setdefault(key, [0.0] * (len(self.buckets) + 2))
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                row[i] += 1
                break
        row[-2] += value
        row[-1] += 1

    def count(self, **labels: object) -> float:
        row = self._series.get(self._key(labels))
        return row[-1] if row else 0.0

    def samples(self) -> list[str]:
        out = []
        for key, row in sorted(self._series.items()):
            cumulative = 0.0
            for bound, n in zip(self.buckets, row, strict=False):
                cumulative += n
                out.append(f"{self.name}_bucket{self._label_text(key, (('le', _fmt(bound)),))} {_fmt(cumulative)}")
            out.append(f"{self.name}_sum{self._label_text(key)} {_fmt(row[-2])}")
            out.append(f"{self.name}_count{self._label_text(key)} {_fmt(row[-1])}")
        return out


class Registry:
    """The metrics of one process, rendered in declaration order."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._dropped: Counter | None = None
        self._collectors: list[Callable[[], None]] = []

    def collect_on_render(self, collect: Callable[[], None]) -> Callable[[], None]:
        """Run ``collect`` before each render: gauges that take a pass over a big state are
        computed when someone reads them, not on a timer. Returns the function that removes it."""
        self._collectors.append(collect)
        return lambda: self._collectors.remove(collect)

    def register(self, metric: _Metric) -> None:
        if metric.name in self._metrics:
            raise MetricError(f"metric {metric.name} declared twice")
        self._metrics[metric.name] = metric

    def dropped(self, name: str) -> None:
        if self._dropped is not None and name != self._dropped.name:
            self._dropped.inc(metric=name)

    def get(self, name: str) -> _Metric:
        return self._metrics[name]

    def names(self) -> list[str]:
        return list(self._metrics)

    def series_names(self) -> set[str]:
        """Every sample name a scrape can show (histograms add ``_bucket``/``_sum``/``_count``)."""
        out = set()
        for m in self._metrics.values():
            if isinstance(m, Histogram):
                out |= {f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count"}
            else:
                out.add(m.name)
        return out

    def render(self) -> str:
        for collect in list(self._collectors):
            collect()
        lines: list[str] = []
        for m in self._metrics.values():
            lines.extend(m.render())
        return "\n".join(lines) + "\n"


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REGISTRY = Registry()
REGISTRY._dropped = Counter(
    "phalanx_metrics_dropped_series_total",
    "Observations dropped because a metric reached its series limit.", ["metric"], max_series=200)

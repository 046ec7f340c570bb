"""Reading a Prometheus text exposition (a ``/metrics`` page) with ``prometheus_client``'s parser.

``phalanx_localstack.stack`` waits on placement's ``phalanx_placement_nodes`` with it, and the tests
and benchmarks read the services' and the API server's ``/metrics`` through it. Writing the page
stays ``phalanx_telemetry.metrics`` (bounded label sets, the dropped-series counter).
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def sample_key(name: str, labels: dict[str, str]) -> str:
    """``name{label="value",...}``, labels in the given order, values escaped as in the text."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def samples(text: str) -> dict[str, float]:
    """Every sample of the page as ``{'name{label="value",...}': value}``, labels in the order the
    page writes them (so a key reads like the line). Raises ``ValueError`` for a malformed page."""
    return {sample_key(s.name, s.labels): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` whose labels are exactly ``labels``; None when absent."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None

"""What the benchmarks that run schedulers on a kwok control plane share.

``bench/scale.py``, ``bench/peers.py`` and their helpers (``peers_backends.py``,
``peers_kueue.py``, ``queue_share.py``, ``scale_report.py``) import it; like them it needs
``tests/kube`` (``kubeharness``) on ``sys.path``, which the two scripts put there. It holds:
progress lines on stderr (``say``), the harness's kwok stages without the periodic node
heartbeat (``kwok_stages``), creating objects from a few threads (``in_threads``), deleting a
namespace's pods and waiting until they are gone (``delete_pods``), the API server's own count
of the requests it served and the watch events it sent (``api_counts``), and matplotlib for a
``--plot`` (``pyplot_or_exit``).
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubeharness
import yaml
from kubeharness import KubeApi

from phalanx_bench.plotting import PlotUnavailable, pyplot

CREATORS = 8
"""Threads that create pods (and nodes) at once."""


_SAMPLE = re.compile(r'^(apiserver_request_total|apiserver_watch_events_total)\{(.*)\} ([0-9.e+]+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def api_counts(api: KubeApi) -> Counter:
    """What the API server has served so far, from its ``/metrics``: requests by
    ``"VERB resource[/subresource]"`` and watch events sent by ``"WATCH-EVENT kind"`` (every
    client's: take the difference over a phase)."""
    out: Counter = Counter()
    text = api.get("/metrics")
    for line in text.splitlines() if isinstance(text, str) else ():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        if m.group(1) == "apiserver_request_total":
            sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
            out[f"{labels.get('verb', '?')} {labels.get('resource', '?')}{sub}"] += float(m.group(3))
        else:
            out[f"WATCH-EVENT {labels.get('resource') or labels.get('kind', '?')}"] += float(m.group(3))
    return out


def kwok_took_in(api: KubeApi, n: int, before: Counter) -> None:
    """Wait until kwok has taken in every node: it lists each new node's pods once (one ``LIST
    pods`` per node on the API server, counted since ``before``), 15 s for 5,000 nodes on a quiet
    machine. A phase started earlier pays for it: at 5,000 nodes, the first phase of
    ``bench/scale.py`` counted 0.94 pod listings per pod bound, and kwok's CPU in the control plane's."""
    deadline = time.monotonic() + 60 + 0.05 * n
    while True:
        done = (api_counts(api) - before)["LIST pods"]
        if done >= n:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"kwok listed the pods of only {done:.0f} of {n} nodes")
        time.sleep(1)


def say(*a: object) -> None:
    """A progress line on stderr (stdout is the results)."""
    print(*a, file=sys.stderr, flush=True)


def kwok_stages(workdir: Path, bench: str) -> Path:
    """The harness's kwok stages without the periodic node heartbeat (at thousands of nodes it
    would take the control plane's CPU; nothing here needs it), written to
    ``workdir/kwok-stages-<bench>.yaml``."""
    docs = [d for d in yaml.safe_load_all(kubeharness.STAGES.read_text()) if d]
    workdir.mkdir(parents=True, exist_ok=True)  # --keep DIR may not exist yet
    out = workdir / f"kwok-stages-{bench}.yaml"
    out.write_text(yaml.safe_dump_all([d for d in docs if d["metadata"]["name"] != "node-heartbeat"]))
    return out


def in_threads(fn: Callable[[Any], object], items: Iterable, workers: int = CREATORS) -> None:
    """``fn`` on every item from ``workers`` threads; the first exception is raised."""
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(fn, items):
            pass


def delete_pods(api: KubeApi, namespace: str, timeout_s: float = 120) -> None:
    """Delete every pod of ``namespace`` (no grace period) and wait until none is listed."""
    api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", {"gracePeriodSeconds": 0})
    deadline = time.monotonic() + timeout_s
    while api.get(f"/api/v1/namespaces/{namespace}/pods", query={"limit": 1})["items"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"pods of {namespace} not gone after {timeout_s:.0f} s")
        time.sleep(0.5)


def pyplot_or_exit():
    """``phalanx_bench.plotting.pyplot()``, or exit with its message saying how to install
    matplotlib (a script's ``--plot``)."""
    try:
        return pyplot()
    except PlotUnavailable as e:
        raise SystemExit(str(e)) from e

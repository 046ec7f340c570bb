"""A Queue object's ``spec.preemption.preemptMinRuntime`` and ``reclaimMinRuntime``
(libs/phalanx_kubeobjects/queuespec.py): Kubernetes durations read into seconds, absent ones
left to the parent, a broken one the queue's problem naming the field and the rule — and the
CRD's schema pattern (deploy/k8s, the Helm chart's copy) accepting exactly what the reader
accepts, so the API server and ``phalanx validate`` refuse the same objects."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from phalanx_kubeobjects.queuespec import queue_from_object

ROOT = Path(__file__).resolve().parents[2]
CRDS = [ROOT / "deploy/k8s/crds/queues.scheduling.phalanx.io.yaml",
        ROOT / "deploy/helm/phalanx/crds/queues.scheduling.phalanx.io.yaml"]


def read(preemption: dict):
    return queue_from_object({"metadata": {"name": "team-a"}, "spec": {"preemption": preemption}})


@pytest.mark.parametrize(("text", "seconds"), [("10m", 600.0), ("90s", 90.0), ("1h30m", 5400.0), ("500ms", 0.5),
                                                ("1.5h", 5400.0), ("0s", 0.0), ("168h", 604800.0)])
def test_a_duration_is_read_into_seconds(text, seconds):
    spec = read({"preemptMinRuntime": text, "reclaimMinRuntime": text})
    assert (spec.problem, spec.preempt_min_runtime_s, spec.reclaim_min_runtime_s) == ("", seconds, seconds)


def test_absent_minimums_are_the_parents():
    spec = read({"withinQueue": "Never"})
    assert (spec.preempt_min_runtime_s, spec.reclaim_min_runtime_s) == (None, None)


RULE = "a duration such as 30s, 10m or 1h30m (units h, m, s, ms), at most 168h"


@pytest.mark.parametrize(("case", "preemption", "problem"), [
    ("a bare number has no unit", {"preemptMinRuntime": "10"}, f"spec.preemption.preemptMinRuntime: {RULE}"),
    ("a number is not a duration", {"reclaimMinRuntime": 600}, f"spec.preemption.reclaimMinRuntime: {RULE}"),
    ("negative", {"preemptMinRuntime": "-5m"}, f"spec.preemption.preemptMinRuntime: {RULE}"),
    ("beyond a week", {"reclaimMinRuntime": "169h"}, f"spec.preemption.reclaimMinRuntime: {RULE}"),
    ("days are not a Kubernetes unit", {"preemptMinRuntime": "1d"}, f"spec.preemption.preemptMinRuntime: {RULE}"),
    ("an unknown field", {"minRuntime": "5m"}, "spec.preemption.minRuntime: unknown field (withinQueue, reclaim, "
                                               "preemptMinRuntime, reclaimMinRuntime)"),
])
def test_a_broken_minimum_is_the_queues_problem_naming_the_field_and_the_rule(case, preemption, problem):
    assert read(preemption).problem == problem


@pytest.mark.parametrize("crd", CRDS, ids=["deploy", "helm"])
@pytest.mark.parametrize("text", ["10m", "90s", "1h30m", "500ms", "1.5h", "0s", "10", "-5m", "1d", "m", "5 m", ""])
def test_the_crd_pattern_accepts_what_the_reader_accepts(crd, text):
    doc = yaml.safe_load(crd.read_text())
    props = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    for field in ("preemptMinRuntime", "reclaimMinRuntime"):
        pattern = props["spec"]["properties"]["preemption"]["properties"][field]["pattern"]
        assert bool(re.search(pattern, text)) == (read({field: text}).problem == ""), (field, text)
    assert "recentGPUHours" in props["status"]["properties"]

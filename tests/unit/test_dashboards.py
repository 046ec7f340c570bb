"""The Grafana dashboards and Prometheus config ask only for what Phalanx exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from phalanx_telemetry import metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))

PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "rate", "irate", "increase", "histogram_quantile", "by", "without",
    "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "topk", "bottomk",
    "clamp_min", "clamp_max", "abs", "delta", "deriv", "time", "vector", "scalar", "label_replace",
    "max_over_time", "min_over_time", "avg_over_time", "absent", "bool",
}


def promql_queries() -> list[tuple[str, str]]:
    out = []
    for path in DASHBOARDS:
        def walk(panels, path=path):
            for p in panels:
                walk(p.get("panels", []))
                for t in p.get("targets", []):
                    if "expr" in t:
                        out.append((f"{path.name}: {p['title']}", t["expr"]))
        walk(json.loads(path.read_text())["panels"])
    return out


def metric_names(expr: str) -> set[str]:
    """Identifiers in ``expr`` that are metric names: not inside ``{...}`` label matchers, not
    ``by (...)`` label lists, not strings, not functions or keywords."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return {n for n in names if n not in PROMQL_WORDS and not re.fullmatch(r"\d.*|e\d+", n)}


def test_there_is_a_dashboard_with_queries():
    assert DASHBOARDS and len(promql_queries()) >= 10


@pytest.mark.parametrize("where, expr", promql_queries())
def test_every_query_names_only_metrics_the_registry_exports(where, expr):
    names = metric_names(expr)
    assert names, f"{where}: no metric in {expr!r}"
    unknown = names - metrics.REGISTRY.series_names()
    assert not unknown, f"{where}: {sorted(unknown)} are not exported (query {expr!r})"


def test_the_metric_name_parser_ignores_labels_functions_and_ranges():
    assert metric_names('histogram_quantile(0.99, sum by (le, outcome) (rate(a_seconds_bucket{x="y"}[5m])))') == {
        "a_seconds_bucket"}


def test_every_group_by_label_is_a_label_the_metric_has():
    labels = {n: set(metrics.REGISTRY.get(n).label_names) for n in metrics.REGISTRY.names()}
    for where, expr in promql_queries():
        for grouped in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            wanted = {g.strip() for g in grouped.split(",")} - {"le"}
            for name in metric_names(expr):
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                assert wanted <= labels.get(base, labels.get(name, set())), f"{where}: {name} lacks {wanted}"


def test_grafana_datasources_match_the_uids_the_dashboards_use():
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/phalanx.yaml").read_text())
    uids = {d["uid"] for d in ds["datasources"]}
    used = set()
    for path in DASHBOARDS:
        for p in json.loads(path.read_text())["panels"]:
            if "datasource" in p:
                used.add(p["datasource"]["uid"])
    assert used <= uids


def test_prometheus_scrapes_every_compose_service_on_the_health_port():
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = {n for n, s in compose["services"].items() if s.get("command", [None])[0] == "run"}
    assert {t.split(":")[0] for t in targets} == services
    assert {t.split(":")[1] for t in targets} == {"8080"}


RULES = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))


def alert_rules() -> list[tuple[str, str]]:
    return [(f"{path.name}: {r['alert']}", r["expr"]) for path in RULES
            for group in yaml.safe_load(path.read_text())["groups"] for r in group["rules"]]


def test_prometheus_loads_the_alert_rules_and_compose_mounts_them():
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert prom["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert "./deploy/prometheus/rules:/etc/prometheus/rules:ro" in compose["services"]["prometheus"]["volumes"]
    assert {name.split(": ")[1] for name, _ in alert_rules()} >= {
        "PhalanxDeadLetters", "PhalanxReconcilerFindings", "PhalanxInvalidKvEntries"}


@pytest.mark.parametrize("where, expr", alert_rules())
def test_every_alert_names_only_metrics_the_registry_exports_with_their_labels(where, expr):
    names = metric_names(expr)
    assert names and names <= metrics.REGISTRY.series_names(), f"{where}: {sorted(names)}"
    for grouped in re.findall(r"\bby\s*\(([^)]*)\)", expr):
        for name in names:
            assert {g.strip() for g in grouped.split(",")} <= set(metrics.REGISTRY.get(name).label_names), where

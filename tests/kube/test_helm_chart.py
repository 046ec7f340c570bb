"""deploy/helm/phalanx with a real helm (tools/helm) and the real kube-apiserver: lint, the same
objects as the kustomize base, copies of the CRDs, alert rules and dashboard, bad values refused
by the schema with the field named, a server-side dry run of everything it renders, and the
services' least-privilege RBAC. One release's life is test_helm_release.py."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import pytest
import yaml
from helmtool import CHART, Helm, helm_binary
from kubeharness import HarnessError, KubeApi, unique
from rbactable import ACCESS, FENCE_ACCESS, GROUPS, scope

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "k8s"
HELM_ONLY_LABELS = {"app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart"}
NO_CRD_HERE = {"ServiceMonitor", "PrometheusRule", "Certificate"}
"""Kinds of the optional integrations whose CRDs (Prometheus Operator, cert-manager) the test
control plane does not serve; the dry run covers every other kind the chart renders."""
CLUSTER_KINDS = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


@pytest.fixture(scope="module")
def helm_bin() -> Path:
    try:
        return helm_binary()
    except HarnessError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def helm(helm_bin) -> Helm:
    helm = Helm(helm_bin)
    yield helm
    shutil.rmtree(helm.home, ignore_errors=True)


# -- the chart on its own ----------------------------------------------------------------------------
def test_helm_lint_passes_strict(helm):
    out = helm.run("lint", "--strict", str(CHART)).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def _normalised(obj: dict) -> dict:
    """``obj`` without what only Helm adds: its labels and annotations (helm.sh/*, checksum/*)
    and the revision suffix of the bus-init Job's name."""
    def strip(meta: dict | None) -> None:
        for key in ("labels", "annotations"):
            if meta and key in meta:
                meta[key] = {k: v for k, v in meta[key].items()
                             if k not in HELM_ONLY_LABELS and not k.startswith(("helm.sh/", "checksum/"))}
                if not meta[key]:
                    del meta[key]
    strip(obj["metadata"])
    strip((obj.get("spec", {}).get("template") or {}).get("metadata"))
    if obj["kind"] == "Job" and obj["metadata"]["name"].startswith("phalanx-bus-init-"):
        obj["metadata"]["name"] = "phalanx-bus-init"
    return obj


def test_the_chart_renders_the_kustomize_base_with_the_credentials_left_to_the_admin(helm):
    """deploy/k8s stays the chart's output for release phalanx in phalanx-system when the admin
    makes the bus Secrets (credentials.generate false), object for object, field for field."""
    chart = helm.template("phalanx", "phalanx-system", "--set", "credentials.generate=false",
                          "--set", "credentials.tls.source=existing")
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    base = [d for f in listed for d in yaml.safe_load_all((BASE / f).read_text()) if d and d["kind"] != "Namespace"]
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    got, want = {key(o): o for o in map(_normalised, chart)}, {key(o): o for o in base}
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k] == want[k], "\n".join(difflib.unified_diff(
            yaml.safe_dump(want[k]).splitlines(), yaml.safe_dump(got[k]).splitlines(), "deploy/k8s", "chart",
            lineterm=""))


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.glob("*")) if p.suffix in (".yaml", ".yml", ".json")} \
        if d.is_dir() else {}


def test_the_charts_crds_are_copies_of_deploy_k8s_crds():
    """Helm installs crds/ before the templates; deploy/k8s/crds (may not exist yet) is the source."""
    assert _files(CHART / "crds") == _files(BASE / "crds")


def test_the_charts_alert_rules_and_dashboard_are_copies_of_deploy():
    assert (CHART / "files" / "prometheus-rules.yaml").read_bytes() == (
        REPO / "deploy" / "prometheus" / "rules" / "phalanx.yml").read_bytes()
    assert (CHART / "files" / "grafana-dashboard.json").read_bytes() == (
        REPO / "deploy" / "grafana" / "dashboards" / "phalanx.json").read_bytes()


BAD_VALUES = [  # (--set, the field and the rule the message names)
    ("placement.replicas=-1", "at '/placement/replicas': minimum: got -1, want 1"),
    ("placment.replicas=3", "additional properties 'placment' not allowed"),
    ("nats.replicas=2", "at '/nats/replicas': value must be one of 1, 3, 5"),
    ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
    ("credentials.tls.source=vault", "at '/credentials/tls/source'"),
    ("topologyDiscovery.kubeletDir=var/lib/kubelet", "at '/topologyDiscovery/kubeletDir'"),
    ("nats.storage.size=ten", "at '/nats/storage/size'"),
]


@pytest.mark.parametrize(("setting", "message"), BAD_VALUES)
def test_a_bad_value_is_refused_with_the_field_named(helm, setting, message):
    done = helm.run("template", "phalanx", str(CHART), "--set", setting, check=False)
    assert done.returncode == 1 and message in done.stderr, done.stderr


# -- the chart on the real API server ----------------------------------------------------------------
VARIANTS = {  # name -> --set flags
    "every option on": ["metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true",
                        "grafanaDashboard.enabled=true", "image.pullPolicy=Always", "imagePullSecrets[0].name=regcred",
                        "nodeSelector.pool=system", "tolerations[0].key=dedicated", "tolerations[0].operator=Exists"],
    "the smallest": ["nats.replicas=1", "migManager.enabled=false", "networkPolicy.enabled=false",
                     "admissionPolicy.enabled=false", "credentials.tls.source=cert-manager",
                     "credentials.tls.certManager.issuerRef.name=my-ca"],
    "the admin's own Secrets": ["credentials.generate=false", "credentials.tls.source=existing"],
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_everything_the_chart_renders_passes_a_server_side_dry_run(helm, kube_api, variant):
    ns = unique("helm-dry")
    kube_api.create_namespace(ns)
    objs = helm.template(f"phalanx-{ns}", ns, "--include-crds", *(a for s in VARIANTS[variant] for a in ("--set", s)))
    checked = [o for o in objs if o["kind"] not in NO_CRD_HERE]
    for obj in checked:
        result = kube_api.apply(obj, dry_run=True)
        assert (result["kind"], result["metadata"]["name"]) == (obj["kind"], obj["metadata"]["name"])
    assert len(checked) >= 25
    assert {o["kind"] for o in objs} - {o["kind"] for o in checked} == {
        "every option on": {"ServiceMonitor", "PrometheusRule"}, "the smallest": {"Certificate"}}.get(variant, set())
    assert kube_api.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/phalanx-binder", ok=(404,))[0] == 404


def test_the_cert_manager_certificate_names_what_the_hook_would(helm):
    """Both ways to the nats certificate name the same Services (templates/_helpers.tpl and
    phalanx bus kube-secrets)."""
    from phalanx_cli.bus_secrets import dns_names

    helm_objs = helm.template("phalanx", "ns-a", "--set", "credentials.tls.source=cert-manager",
                                              "--set", "credentials.tls.certManager.issuerRef.name=ca",
                                              "--set", "clusterDomain=example.org")
    (cert,) = [o for o in helm_objs if o["kind"] == "Certificate"]
    assert cert["spec"]["dnsNames"] == list(dns_names("ns-a", "nats", "example.org"))
    assert cert["spec"]["secretName"] == "phalanx-nats-tls" and cert["spec"]["usages"] == ["server auth", "client auth"]


def test_the_charts_service_accounts_get_exactly_the_least_privilege_table(helm, kube, kube_api, kube_ns):
    """The chart's RBAC objects, applied for real for a release in its own namespace, grant each
    ServiceAccount what rbactable says (the table the kustomize base is held to as well)."""
    ns = unique("helm-rbac")
    kube_api.create_namespace(ns)
    rbac = [o for o in helm.template(f"phalanx-{ns}", ns) if o["kind"] in
            ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
            and "helm.sh/hook" not in o["metadata"].get("annotations", {})]
    for obj in rbac:
        kube_api.apply(obj)
    try:
        def sa(service: str) -> KubeApi:
            return kube.api_as(kube.service_account_token(ns, f"phalanx-{service}"))
        got = {svc: [(v, r, s, sa(svc).can_i(v, r, subresource=s, namespace=scope(r, s, kube_ns),
                                                     group=GROUPS.get(r, "")))
                     for v, r, s, _ in table] for svc, table in ACCESS.items()}
        assert got == ACCESS
        fences = [(svc, verb, sa(svc).can_i(verb, "leases", group="coordination.k8s.io", namespace=ns),
                   sa(svc).can_i(verb, "leases", group="coordination.k8s.io", namespace=kube_ns))
                  for svc, verb, _, _ in FENCE_ACCESS]
        assert fences == FENCE_ACCESS
    finally:
        for obj in rbac:
            if obj["kind"] in CLUSTER_KINDS:
                kube_api.delete(kube_api.resource_path(obj))


def test_the_fair_share_half_life_reaches_placement_only_when_set(helm):
    def placement_args(*sets: str) -> list[str]:
        objs = helm.template("phalanx", "phalanx-system", *(a for s in sets for a in ("--set", s)))
        (dep,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "phalanx-placement"]
        return dep["spec"]["template"]["spec"]["containers"][0]["args"]

    assert placement_args() == ["run", "placement", "--health-addr", "0.0.0.0:8080"]
    assert placement_args("placement.usageHalfLifeS=3600") == [
        "run", "placement", "--health-addr", "0.0.0.0:8080", "--usage-half-life-s", "3600"]

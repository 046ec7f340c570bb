"""Conformance with kube-scheduler: on one real kube-apiserver with kwok nodes, kube-scheduler and
Phalanx (every service as its own process, node agents reporting ``NodeKubeState`` from the real
API) schedule the same pods, one scheduler at a time, and must place or refuse them alike.

The cluster is the module's own (etcd, kube-apiserver, kwok, kube-scheduler), so both schedulers
count the same six nodes. Each case is a pod shape; it is tried **once per node**, pinned there
by a required node-affinity term on ``kubernetes.io/hostname`` (a label expression, which
kube-scheduler does not narrow in PreFilter, so both evaluate every node in the same filter
order). Per (case, node) the two outcomes must agree: bound to that node, or refused; a refused
pod's ``PodScheduled`` message must name the same causes (the "0/6 nodes are available: ..."
histogram, compared whole), except where the case declares a difference and why.

The agreement table is written to ``docs/placement.md`` between its markers by the run
(``PHALANX_CONFORMANCE_DOCS=1``; otherwise to ``$PHALANX_CONFORMANCE_OUT`` or the test's tmp dir).
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import msgspec
import pytest
import yaml
from kubeharness import ControlPlane, KubeApi, fake_gpu_node, start_control_plane

from phalanx_bus import Bus
from phalanx_bus.records import read_all
from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_proto import subjects as S
from phalanx_proto.scheduling import NodeKubeState

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO / "examples" / "clusters" / "topology" / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
DOCS = REPO / "docs" / "placement.md"
BEGIN, END = "<!-- conformance table: written by tests/e2e/test_conformance.py -->", "<!-- end of conformance table -->"
SERVICES = ("topology-discovery", "gang-coordinator", "placement", "mig-manager", "binder")
ENABLE = {"lj_runtimekit_enable": "true"}
NS = "conformance"
GPU = {"nvidia.com/gpu": "1"}

# -- the nodes ----------------------------------------------------------------------------------
NODES = {
    # name: (allocatable besides GPUs, labels, spec, kwok-managed, why it is there)
    "plain": ({"cpu": "8", "memory": "32Gi", "pods": "110", "example.com/widget": "2"},
              {"zone": "z1", "tier": "gold"}, {}, True,
              "8 CPUs, 32 GiB, 2 example.com/widget, zone z1, tier gold; two app=conf-web pods of another scheduler"),
    "small": ({"cpu": "2", "memory": "4Gi", "pods": "110"}, {"zone": "z2"}, {}, True,
              "2 CPUs (1 taken by a pod of another scheduler), 4 GiB, zone z2"),
    "tainted": ({"cpu": "8", "memory": "32Gi", "pods": "110"}, {}, {"taints": [
        {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}, True, "taint dedicated=infra:NoSchedule"),
    "cordoned": ({"cpu": "8", "memory": "32Gi", "pods": "110"}, {}, {"unschedulable": True}, True, "cordoned"),
    "ports": ({"cpu": "8", "memory": "32Gi", "pods": "110"}, {}, {}, True,
              "host port 8080/TCP bound by a pod of another scheduler"),
    "notready": ({"cpu": "8", "memory": "32Gi", "pods": "110"}, {}, {"taints": [
        {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]}, False,
        "Ready=False, with the not-ready taint the node lifecycle controller sets"),
}


def node_name(short: str) -> str:
    return f"conf-{short}"


def node_object(short: str) -> dict:
    alloc, labels, spec, kwok, _ = NODES[short]
    obj = fake_gpu_node(node_name(short), labels={**ENABLE, **labels}, kwok=kwok)
    obj["status"] = {"capacity": {**alloc, "nvidia.com/gpu": "8"}, "allocatable": {**alloc, "nvidia.com/gpu": "8"}}
    obj["spec"] = copy.deepcopy(spec)
    if not kwok:
        obj["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                                        "message": "conformance: not ready", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    return obj


# -- the cases ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    what: str
    limits: dict = field(default_factory=lambda: dict(GPU))
    requests: dict = field(default_factory=dict)
    spec: dict = field(default_factory=dict)
    terms: tuple = ()
    """Required node-affinity terms (each gets the pin added)."""
    ports: tuple = ()
    differs: str = ""
    """Declared difference in the refusal messages, and why (feasibility must still agree)."""
    texts: dict = field(default_factory=dict)
    """kube-scheduler reason text → Phalanx's, where ``differs`` says they differ."""
    labels: dict = field(default_factory=dict)
    """The pod's labels (none of the cases' pods match a spread selector: the pods of one phase
    are created together, and one bound first must not change another's count)."""


SPREAD = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
          "labelSelector": {"matchLabels": {"app": "conf-web"}}}


REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
WEB_TERM = {"labelSelector": {"matchLabels": {"app": "conf-web"}}, "topologyKey": "zone"}


def exprs(*e: tuple) -> dict:
    return {"matchExpressions": [{"key": k, "operator": op, **({"values": list(v)} if v else {})} for k, op, v in e]}


CASES = (
    Case("one-gpu", "1 GPU, nothing else"),
    Case("cpu", "1500m CPU", requests={"cpu": "1500m"}),
    Case("memory", "16 GiB memory", requests={"memory": "16Gi"}),
    Case("cpu-and-memory", "1500m CPU and 16 GiB (two shortfalls on one node)", requests={"cpu": "1500m", "memory": "16Gi"}),
    Case("cpu-limit-only", "a 4-CPU limit without a request (the request defaults to the limit)",
         limits={**GPU, "cpu": "4"}),
    Case("extended", "1 example.com/widget", limits={**GPU, "example.com/widget": "1"}),
    Case("extended-too-many", "3 example.com/widget (more than any node has)", limits={**GPU, "example.com/widget": "3"}),
    Case("tdm-share", "a TDM share (50 % core, 4 GiB) and 1500m CPU",
         limits={"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "4"}, requests={"cpu": "1500m"}),
    Case("tolerates-taint", "tolerates dedicated=infra", spec={"tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}]}),
    Case("tolerates-everything", "tolerates every taint (operator Exists, no key)", spec={"tolerations": [
        {"operator": "Exists"}]}),
    Case("tolerates-cordon", "tolerates node.kubernetes.io/unschedulable", spec={"tolerations": [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]}),
    Case("tolerates-not-ready", "tolerates node.kubernetes.io/not-ready", spec={"tolerations": [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}]}),
    Case("node-selector", "nodeSelector zone=z1", spec={"nodeSelector": {"zone": "z1"}}),
    Case("affinity-in", "required affinity zone In (z1, z2)", terms=(exprs(("zone", "In", ("z1", "z2"))),)),
    Case("affinity-not-in", "required affinity tier NotIn (gold)", terms=(exprs(("tier", "NotIn", ("gold",))),)),
    Case("affinity-does-not-exist", "required affinity zone DoesNotExist", terms=(exprs(("zone", "DoesNotExist", ())),)),
    Case("affinity-two-terms", "two required terms (zone In z2, or tier Exists): either may match",
         terms=(exprs(("zone", "In", ("z2",))), exprs(("tier", "Exists", ())))),
    Case("host-port", "hostPort 8080", ports=({"containerPort": 80, "hostPort": 8080},)),
    Case("host-port-other-protocol", "hostPort 8080/UDP (the taken one is TCP)",
         ports=({"containerPort": 80, "hostPort": 8080, "protocol": "UDP"},)),
    Case("host-network", "hostNetwork with containerPort 8080", spec={"hostNetwork": True},
         ports=({"containerPort": 8080},)),
    Case("spread-honor", "DoNotSchedule spread over zone, maxSkew 1, of the app=conf-web pods (two on plain); "
         "nodeAffinityPolicy Honor, so the pinned node is the only domain",
         labels={"app": "conf-case"}, spec={"topologySpreadConstraints": [dict(SPREAD)]}),
    Case("spread-ignore", "the same with nodeAffinityPolicy Ignore: zones z1 (two) and z2 (none) are both domains",
         labels={"app": "conf-case"}, spec={"topologySpreadConstraints": [{**SPREAD, "nodeAffinityPolicy": "Ignore"}]}),
    Case("spread-min-domains", "the same with Honor and minDomains 2: one domain, so the least count is taken as 0",
         labels={"app": "conf-case"}, spec={"topologySpreadConstraints": [{**SPREAD, "minDomains": 2}]}),
    Case("pod-affinity", "required pod affinity to the app=conf-web pods, topologyKey zone",
         labels={"app": "conf-case"}, spec={"affinity": {"podAffinity": {REQUIRED: [WEB_TERM]}}}),
    Case("pod-anti-affinity", "required pod anti-affinity to the app=conf-web pods, topologyKey zone "
         "(a node without the zone label is in no zone)",
         labels={"app": "conf-case"}, spec={"affinity": {"podAntiAffinity": {REQUIRED: [WEB_TERM]}}}),
    Case("pod-anti-affinity-ns-selector", "the same anti-affinity, its namespaces chosen by a namespaceSelector "
         "on the namespace's labels (it selects the pods' namespace)", labels={"app": "conf-case"},
         spec={"affinity": {"podAntiAffinity": {REQUIRED: [
             {**WEB_TERM, "namespaceSelector": {"matchLabels": {"conformance-role": "standing"}}}]}}}),
    Case("pod-affinity-ns-selector-none", "required pod affinity whose namespaceSelector selects no namespace "
         "(so no pod, not even the pod itself)", labels={"app": "conf-case"},
         spec={"affinity": {"podAffinity": {REQUIRED: [
             {**WEB_TERM, "namespaceSelector": {"matchLabels": {"conformance-role": "nobody"}}}]}}}),
    Case("gpus-too-many", "9 GPUs (nodes have 8)", limits={"nvidia.com/gpu": "9"},
         differs="GPU shortfalls are Phalanx's GPU plugins' own reason, not NodeResourcesFit's",
         texts={"Insufficient nvidia.com/gpu": "insufficient free GPUs"}),
)


def pod(case: Case, scheduler: str, node: str) -> dict:
    container = {"name": "c", "image": "registry.example/app:1",
                 "resources": {"limits": dict(case.limits), **({"requests": dict(case.requests)} if case.requests else {})}}
    if case.ports:
        container["ports"] = [dict(p) for p in case.ports]
    pin = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    terms = [copy.deepcopy(t) for t in case.terms] or [{}]
    for t in terms:
        t.setdefault("matchExpressions", []).append(pin)
    spec = {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0, "containers": [container],
            **copy.deepcopy(case.spec),
            "affinity": {**copy.deepcopy(case.spec.get("affinity", {})),
                         "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}}}
    short = "k" if scheduler == "default-scheduler" else "p"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{case.name}-{short}-{node}", "namespace": NS,
                                                           **({"labels": dict(case.labels)} if case.labels else {})},
            "spec": spec}


# -- outcomes -----------------------------------------------------------------------------------
def causes(message: str) -> dict[str, int]:
    """The "N reason" histogram of a "0/M nodes are available: ..." message."""
    _, _, rest = message.partition("nodes are available: ")
    first = rest.split("; ")[0].split(". ")[0].removesuffix(".")  # before any what-if line
    out: dict[str, int] = {}
    for part in first.split(", "):
        n, _, text = part.partition(" ")
        out[text] = out.get(text, 0) + int(n)
    return out


def outcome(obj: dict) -> str | dict | None:
    """``"bound"``, the refusal's cause histogram, or None while undecided."""
    if obj["spec"].get("nodeName"):
        return "bound"
    cond = next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "PodScheduled"), None)
    if cond and cond["status"] == "False" and "nodes are available" in cond.get("message", ""):
        return causes(cond["message"])
    return None


def run_phase(api: KubeApi, case: Case, scheduler: str, timeout_s: float = 90,
              stack: Stack | None = None) -> dict[str, str | dict]:
    """Create the case's pod once per node for ``scheduler``; every node's outcome; pods deleted.
    A pod that is gone before its outcome is one too, with the lines of Phalanx's logs that name
    it (nothing here deletes a pod before the phase ends: if one goes, the table says who did)."""
    pods = {short: pod(case, scheduler, node_name(short)) for short in NODES}
    for p in pods.values():
        api.create_pod(p)
    got: dict[str, str | dict] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < len(pods):
            if time.monotonic() > deadline:
                for short in set(pods) - set(got):
                    status = api.get_pod(NS, pods[short]["metadata"]["name"]).get("status", {})
                    got[short] = {f"no outcome after {timeout_s}s: {status.get('conditions')}": 1}
                break
            for short, p in pods.items():
                if short not in got:
                    obj = api.get_pod(NS, p["metadata"]["name"])
                    o = outcome(obj) if obj is not None else {f"gone before an outcome: {vanished(stack, p)}": 1}
                    if o is not None:
                        got[short] = o
            time.sleep(0.2)
    finally:
        for p in pods.values():
            api.delete(f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}")
    return got


def vanished(stack: Stack | None, pod: dict) -> str:
    """The lines of Phalanx's service logs that name ``pod`` (the evidence of who deleted it)."""
    name = pod["metadata"]["name"]
    if stack is None:
        return "no stack"
    lines = [f"[{svc}] {line}" for svc, proc in stack.procs.items() if getattr(proc, "log_path", None)
             for line in proc.log_path.read_text(errors="replace").splitlines() if name in line]
    return " | ".join(lines[-12:]) or "no log line names it"


STANDING = {"small": 1, "ports": 1, "plain": 2}
"""Pods of another scheduler that stay bound for the whole run, per node."""
STANDING_PODS = ("cpu-user", "port-user", "web-1", "web-2")


DEBOUNCE_S = 0.1
"""The node agents' ``--node-state-debounce-s`` here (0.5 s by default): a report at most this
often, so a phase's pods leave the reports sooner."""
QUIET_S = 6 * DEBOUNCE_S
"""How long the agents' reports must stay at the baseline before a phase starts: several of the
agent's debounce periods, so a report of the last phase's pods still on its way (the pods may
have been bound and deleted before the agent wrote anything) lands inside it."""


def settle(stack: Stack, api: KubeApi, baseline: dict | None = None, timeout_s: float = 60) -> dict:
    """Wait until Phalanx sees the cluster as it was before the last phase: the last phase's
    pods are gone from the API server, the ledger holds no reservation and every node agent
    reports only the standing pods — with ``baseline`` (what the agents reported before the
    first case), exactly that state, host ports and requests included, unchanged for
    ``QUIET_S``. Returns the states."""
    async def settled() -> dict:
        bus = await Bus.connect(stack.url, service="test")
        try:
            states, ledger = await bus.kv(S.KV_NODE_STATE), await bus.kv(S.KV_LEDGER)
            last, quiet_since, seen = "", None, None
            with anyio.move_on_after(timeout_s):
                while True:
                    left = [p["metadata"]["name"] for p in api.get(f"/api/v1/namespaces/{NS}/pods")["items"]
                            if p["metadata"]["name"] not in STANDING_PODS]
                    got, revisions = {}, {}
                    for short in NODES:
                        e = await states.get(S.token(node_name(short)))
                        got[short] = msgspec.json.decode(e.value, type=NodeKubeState) if e else None
                        revisions[short] = e.revision if e else 0
                    pods = {s: st.pods if st else None for s, st in got.items()}
                    held = sum(len(r.value.allocations) for r in (await read_all(ledger))[0])
                    last = f"pods left {left}, pods per node {pods}, reservations {held}"
                    if not left and held == 0 and pods == {s: STANDING.get(s, 0) for s in NODES} and \
                            (baseline is None or got == baseline):
                        if revisions != seen:
                            seen, quiet_since = revisions, time.monotonic()
                        if time.monotonic() - quiet_since >= QUIET_S:
                            return got
                    else:
                        seen = quiet_since = None
                    await anyio.sleep(0.2)
            raise AssertionError(f"Phalanx did not settle after {timeout_s}s: {last}")
        finally:
            await bus.close()

    return anyio.run(settled)


def what_each_sees(api: KubeApi, stack: Stack) -> str:
    """For a disagreement: the pods the API has on each node, and what each node agent reported."""
    async def reported() -> dict:
        bus = await Bus.connect(stack.url, service="test")
        try:
            kv = await bus.kv(S.KV_NODE_STATE)
            return {s: (e.value.decode() if (e := await kv.get(S.token(node_name(s)))) else None) for s in NODES}
        finally:
            await bus.close()

    states = anyio.run(reported)
    lines = []
    for short in NODES:
        pods = api.get("/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node_name(short)}"})["items"]
        lines.append(f"{short}: API pods {[(p['metadata']['name'], p['status'].get('phase')) for p in pods]}; "
                     f"reported {states[short]}")
    return "\n".join(lines)


def verdict(case: Case, kube: dict, phalanx: dict) -> tuple[bool, str]:
    """(agree, what differs) for one case: per node, bound alike, and refusals with the same causes."""
    problems = []
    for short in NODES:
        k, p = kube[short], phalanx[short]
        if (k == "bound") != (p == "bound"):
            problems.append(f"{short}: kube-scheduler {'bound' if k == 'bound' else 'refused'}, "
                            f"Phalanx {'bound' if p == 'bound' else 'refused'}")
        elif k != "bound":
            translated = {case.texts.get(t, t): n for t, n in k.items()}
            if translated != p:
                problems.append(f"{short}: causes {k} vs {p}")
    return not problems, "; ".join(problems)


# -- the cluster, both schedulers and Phalanx ---------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A control plane of the module's own with kube-scheduler, six nodes, their standing pods,
    and the whole Phalanx stack on it."""
    plane: ControlPlane = start_control_plane(with_scheduler=True)
    work = tmp_path_factory.mktemp("conformance")
    stack = None
    try:
        api = plane.api
        api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": NS, "labels": {"conformance-role": "standing"}}})  # what the namespaceSelector rows select
        for short in NODES:  # with their status: kwok keeps an allocatable it finds (a later patch could race it)
            api.create_node(node_object(short))
        standing = [("cpu-user", "small", {"containers": [{"name": "c", "image": "x",
                                                           "resources": {"requests": {"cpu": "1"}}}]}),
                    ("port-user", "ports", {"containers": [{"name": "c", "image": "x",
                                                            "ports": [{"containerPort": 80, "hostPort": 8080}]}]})]
        web = {"containers": [{"name": "c", "image": "x"}]}
        standing += [("web-1", "plain", web), ("web-2", "plain", web)]  # what the spread cases count
        for name, short, spec in standing:
            labels = {"app": "conf-web"} if name.startswith("web-") else {}
            api.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels},
                            "spec": {"nodeName": node_name(short), "terminationGracePeriodSeconds": 0, **spec}})
        cluster_file = work / "cluster.yaml"
        cluster_file.write_text(yaml.safe_dump({"nodes": [
            {"name": node_name(s), "labels": {**ENABLE, **NODES[s][1]}, "topology": str(TOPOLOGY),
             "gpuModel": "Tesla V100-SXM2-16GB", "gpuMemoryMiB": 16384} for s in NODES]}))
        kube_args = ["--cluster", "kube", "--kubeconfig", str(plane.kubeconfig)]
        args = {s: list(kube_args) for s in SERVICES}
        args["gang-coordinator"] += ["--settle-s", "0.2", "--starve-after-s", "0", "--backoff-max-s", "5"]
        args["placement"] += ["--node-state", "required"]
        args["topology-discovery"] += ["--node-state-debounce-s", str(DEBOUNCE_S)]
        stack = Stack(ClusterFile.load(cluster_file), workdir=str(work / "stack"), service_args=args, fleet=False)
        stack.start_nats()
        stack.start_services(timeout_s=180)
        cpus = {s: api.get(f"/api/v1/nodes/{node_name(s)}")["status"]["allocatable"].get("cpu") for s in NODES}
        assert cpus == {s: NODES[s][0]["cpu"] for s in NODES}, "the nodes' allocatable CPU was overwritten"
        yield plane, stack
    finally:
        if stack is not None:
            stack.stop()
        plane.stop()


def table(rows: list[tuple[Case, bool, str, dict, dict]]) -> str:
    lines = ["| case | pod | kube-scheduler places on | Phalanx places on | agree | why not, or the declared difference |",
             "|---|---|---|---|---|---|"]
    for case, agree, problems, kube, phalanx in rows:
        on = lambda got: ", ".join(s for s in NODES if got[s] == "bound") or "none"  # noqa: E731
        note = problems or case.differs
        lines.append(f"| `{case.name}` | {case.what} | {on(kube)} | {on(phalanx)} | "
                     f"{'yes' if agree else '**no**'} | {note} |")
    nodes = "\n".join(f"* `{node_name(s)}`: {NODES[s][4]}" for s in NODES)
    return (f"Nodes (each also 8 V100 GPUs, enabled for Phalanx):\n\n{nodes}\n\n"
            f"{len(rows)} cases x {len(NODES)} nodes, {sum(a for _, a, *_ in rows)} agree.\n\n" + "\n".join(lines))


def write_table(text: str, tmp_path: Path) -> Path:
    if os.environ.get("PHALANX_CONFORMANCE_DOCS") and not os.environ.get("PHALANX_CONFORMANCE_ONLY"):
        doc = DOCS.read_text()
        head, _, rest = doc.partition(BEGIN)
        _, _, tail = rest.partition(END)
        DOCS.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
        return DOCS
    out = Path(os.environ.get("PHALANX_CONFORMANCE_OUT") or tmp_path / "conformance.md")
    out.write_text(text + "\n")
    return out


def test_phalanx_and_kube_scheduler_place_and_refuse_the_same_pods_for_the_same_reasons(cluster, tmp_path):
    plane, stack = cluster
    api = plane.api
    only = [n for n in os.environ.get("PHALANX_CONFORMANCE_ONLY", "").split(",") if n]
    rows = []
    baseline = settle(stack, api)
    for case in [c for c in CASES if not only or c.name in only]:
        kube = run_phase(api, case, "default-scheduler")
        settle(stack, api, baseline)
        phalanx = run_phase(api, case, "phalanx", stack=stack)
        settle(stack, api, baseline)
        agree, problems = verdict(case, kube, phalanx)
        rows.append((case, agree, problems, kube, phalanx))
        if not agree:
            print(f"\n{case.name} disagrees: {problems}\n{what_each_sees(api, stack)}")
    text = table(rows)
    where = write_table(text, tmp_path)
    print(f"\n{text}\n(written to {where})")
    disagree = [(c.name, p) for c, a, p, *_ in rows if not a]
    assert not disagree, "\n".join(f"{n}: {p}" for n, p in disagree) + "\n" + "\n".join(
        stack.tail(n, 20) for n in ("placement", "gang-coordinator"))
    assert json.dumps(rows[0][3]) and rows[0][3]["plain"] == "bound"  # the table is about something


# -- preferred terms: they rank nodes, so there is no per-node agreement to compare ------------
def preferring(name: str, labels: dict, affinity: dict) -> dict:
    """A 1-GPU Phalanx pod allowed on ``plain`` and ``ports`` only (every other case's filters
    are out of the way: both take it), with ``affinity`` besides."""
    allowed = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name("plain"), node_name("ports")]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"schedulerName": "phalanx", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "registry.example/app:1",
                                     "resources": {"limits": dict(GPU)}}],
                     "affinity": {**affinity, "nodeAffinity": {**affinity.get("nodeAffinity", {}), REQUIRED: {
                         "nodeSelectorTerms": [{"matchExpressions": [allowed]}]}}}}}


def bound_to(api: KubeApi, name: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = api.get_pod(NS, name).get("spec", {}).get("nodeName")
        if got:
            return got.removeprefix("conf-")
        time.sleep(0.2)
    raise AssertionError(f"{name} not bound after {timeout_s}s: {api.get_pod(NS, name).get('status')}")


def test_preferences_decide_between_nodes_that_both_fit(cluster):
    """Packing puts a pod on ``plain`` (the tie between two empty nodes goes to the smaller name)
    and the next ones beside it; preferring to keep away from the app=conf-web pods, or from its
    own replicas (preferred pod anti-affinity, or ScheduleAnyway spread over hosts), or
    preferring ``ports`` by node affinity, moves a pod to ``ports``; preferring the app=conf-web
    pods keeps it on ``plain``."""
    plane, stack = cluster
    api = plane.api
    settle(stack, api)
    away_from_web = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "podAffinityTerm": WEB_TERM}]}}
    replicas_apart = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "conf-rep"}},
                                            "topologyKey": "kubernetes.io/hostname"}}]}}
    near_web = {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "podAffinityTerm": WEB_TERM}]}}
    on_ports = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name("ports")]}]}}]}}
    soft = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": {"app": "conf-soft"}}}]
    pods = (("pref-plain", {"app": "conf-pref"}, {}, None), ("pref-away", {"app": "conf-pref"}, away_from_web, None),
            ("pref-near", {"app": "conf-pref"}, near_web, None), ("rep-0", {"app": "conf-rep"}, replicas_apart, None),
            ("rep-1", {"app": "conf-rep"}, replicas_apart, None), ("node-pref", {"app": "conf-pref"}, on_ports, None),
            ("soft-0", {"app": "conf-soft"}, {}, soft), ("soft-1", {"app": "conf-soft"}, {}, soft))
    got: dict[str, str] = {}
    try:
        for name, labels, affinity, spread in pods:
            obj = preferring(name, labels, affinity)
            if spread:
                obj["spec"]["topologySpreadConstraints"] = spread
            api.create_pod(obj)
            got[name] = bound_to(api, name)
    finally:
        for name, *_ in pods:
            api.delete(f"/api/v1/namespaces/{NS}/pods/{name}")
    assert {k: got[k] for k in ("pref-plain", "pref-away", "pref-near", "node-pref")} == \
        {"pref-plain": "plain", "pref-away": "ports", "pref-near": "plain", "node-pref": "ports"}, got
    assert got["rep-0"] != got["rep-1"], got
    assert got["soft-0"] != got["soft-1"], got

"""What each Phalanx ServiceAccount may and may not do on the Kubernetes API: the least-privilege
table that both the kustomize base (test_rbac.py) and the Helm chart (test_helm_chart.py) must
grant, checked with SelfSubjectAccessReviews under each account's own token."""

# (verb, resource, subresource, allowed); namespaced checks run in the test's namespace.
ACCESS = {
    "gang-coordinator": [("list", "pods", "", True), ("watch", "pods", "", True), ("get", "pods", "", True),
                         ("delete", "pods", "", True), ("patch", "pods", "status", True),
                         ("create", "events", "", True), ("patch", "events", "", True),
                         ("create", "pods", "binding", False), ("patch", "pods", "", False),
                         ("create", "pods", "", False), ("list", "nodes", "", False),
                         ("list", "namespaces", "", True), ("watch", "namespaces", "", True),
                         ("get", "namespaces", "", True), ("delete", "namespaces", "", False),
                         ("get", "podgroups", "", True), ("list", "podgroups", "", True),
                         ("watch", "podgroups", "", True), ("patch", "podgroups", "status", True),
                         ("patch", "podgroups", "", False), ("delete", "podgroups", "", False),
                         ("list", "queues", "", True), ("patch", "queues", "status", True),
                         ("patch", "queues", "", False), ("delete", "queues", "", False),
                         ("get", "deviceclasses", "", True), ("list", "deviceclasses", "", True),
                         ("watch", "deviceclasses", "", True), ("list", "resourceslices", "", True),
                         ("watch", "resourceslices", "", True), ("get", "resourceclaims", "", True),
                         ("list", "resourceclaims", "", True), ("watch", "resourceclaims", "", True),
                         ("create", "resourceslices", "", False), ("update", "resourceclaims", "", False),
                         ("create", "resourceclaims", "", False), ("update", "resourceclaims", "status", False),
                         ("update", "resourceclaims", "binding", False)],
    "binder": [("get", "pods", "", True), ("patch", "pods", "", True), ("create", "pods", "binding", True),
               ("create", "pods", "eviction", True), ("list", "poddisruptionbudgets", "", True),
               ("delete", "poddisruptionbudgets", "", False), ("delete", "pods", "", False), ("create", "events", "", True), ("patch", "events", "", True),
               ("list", "pods", "", True), ("watch", "pods", "", True), ("patch", "pods", "status", True),
               ("update", "pods", "status", False), ("get", "nodes", "", False), ("get", "secrets", "", False),
               ("get", "resourceclaims", "", True), ("list", "resourceclaims", "", True),
               ("update", "resourceclaims", "", True), ("create", "resourceclaims", "", True),
               ("delete", "resourceclaims", "", True), ("watch", "resourceclaims", "", False),
               ("patch", "resourceclaims", "", False), ("update", "resourceclaims", "status", True),
               ("patch", "resourceclaims", "status", True), ("update", "resourceclaims", "binding", True),
               ("patch", "resourceclaims", "binding", True), ("list", "resourceslices", "", False),
               ("list", "deviceclasses", "", False), ("update", "resourceclaims", "driver", False)],
    "topology-discovery": [("get", "nodes", "", True), ("list", "nodes", "", True), ("watch", "nodes", "", True),
                           ("patch", "nodes", "status", True), ("patch", "nodes", "", False),
                           ("delete", "nodes", "", False), ("get", "pods", "", True), ("patch", "pods", "", True),
                           ("create", "events", "", True), ("list", "pods", "", True), ("watch", "pods", "", True),
                           ("delete", "pods", "", False),
                           ("create", "pods", "binding", False), ("get", "resourceclaims", "", False),
                           ("update", "resourceclaims", "binding", False)],
    "placement": [("get", "pods", "", False), ("list", "nodes", "", False), ("create", "events", "", False),
                  ("list", "resourceslices", "", False)],
    "mig-manager": [("get", "pods", "", False), ("get", "nodes", "", False), ("create", "events", "", False)],
}
CLUSTER_SCOPED = {"nodes", "namespaces", "queues", "deviceclasses", "resourceslices"}
CLUSTER_SCOPED_SUBRESOURCES = {("resourceclaims", "binding")}
"""Checked at the cluster scope although the resource is namespaced: the API server authorizes
``resourceclaims/binding`` with namespace "" (``AuthorizedForBinding``)."""
GROUPS = {"queues": "scheduling.phalanx.io", "podgroups": "scheduling.k8s.io", "deviceclasses": "resource.k8s.io", "resourceslices": "resource.k8s.io",
          "resourceclaims": "resource.k8s.io", "poddisruptionbudgets": "policy"}
"""Resources outside the core API group."""


def scope(resource: str, subresource: str, namespace: str) -> str:
    """The namespace a check of (resource, subresource) runs in: "" for the cluster scope."""
    cluster = resource in CLUSTER_SCOPED or (resource, subresource) in CLUSTER_SCOPED_SUBRESOURCES
    return "" if cluster else namespace

# leases (coordination.k8s.io): (service, verb, allowed in Phalanx's namespace, allowed in another)
FENCE_ACCESS = [("binder", verb, True, False) for verb in ("get", "create", "update", "patch", "delete")] + [
    ("topology-discovery", "get", True, False), ("topology-discovery", "create", False, False),
    ("topology-discovery", "update", False, False), ("topology-discovery", "delete", False, False),
    ("gang-coordinator", "get", False, False), ("placement", "get", False, False)]

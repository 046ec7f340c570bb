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
                         ("list", "namespaces", "", True), ("delete", "namespaces", "", False),
                         ("list", "queues", "", True), ("patch", "queues", "status", True),
                         ("patch", "queues", "", False), ("delete", "queues", "", False)],
    "binder": [("get", "pods", "", True), ("patch", "pods", "", True), ("create", "pods", "binding", True),
               ("create", "pods", "eviction", True), ("delete", "pods", "", False), ("create", "events", "", True), ("patch", "events", "", True),
               ("list", "pods", "", True), ("watch", "pods", "", True), ("patch", "pods", "status", False),
               ("get", "nodes", "", False), ("get", "secrets", "", False)],
    "topology-discovery": [("get", "nodes", "", True), ("list", "nodes", "", True), ("watch", "nodes", "", True),
                           ("patch", "nodes", "status", True), ("patch", "nodes", "", False),
                           ("delete", "nodes", "", False), ("get", "pods", "", True), ("patch", "pods", "", True),
                           ("create", "events", "", True), ("list", "pods", "", True), ("watch", "pods", "", True),
                           ("delete", "pods", "", False),
                           ("create", "pods", "binding", False)],
    "placement": [("get", "pods", "", False), ("list", "nodes", "", False), ("create", "events", "", False)],
    "mig-manager": [("get", "pods", "", False), ("get", "nodes", "", False), ("create", "events", "", False)],
}
CLUSTER_SCOPED = {"nodes", "namespaces", "queues"}
GROUPS = {"queues": "scheduling.phalanx.io"}
"""Resources outside the core API group."""

# leases (coordination.k8s.io): (service, verb, allowed in Phalanx's namespace, allowed in another)
FENCE_ACCESS = [("binder", verb, True, False) for verb in ("get", "create", "update", "patch", "delete")] + [
    ("topology-discovery", "get", True, False), ("topology-discovery", "create", False, False),
    ("topology-discovery", "update", False, False), ("topology-discovery", "delete", False, False),
    ("gang-coordinator", "get", False, False), ("placement", "get", False, False)]

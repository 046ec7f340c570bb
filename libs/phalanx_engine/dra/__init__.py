"""Dynamic Resource Allocation (``resource.k8s.io/v1``) in the engine. So far: ``celenv``, the
CEL selector environment (cel-expr-python / cel-cpp) with the Kubernetes quantity and semver
libraries, and ``semver``; ``pools`` (which pools and devices reach a node) and ``usage``
(devices, shares and counters taken)."""

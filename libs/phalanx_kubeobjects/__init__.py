"""phalanx_kubeobjects: Kubernetes objects read into Phalanx's values, by the API server's rules.

What a pod asks for (``requests``: GPUs, each container's by ``containers``; ``podspec``:
everything else kube-scheduler reads, which nodes by ``nodeterms``),
which gang it belongs to (``gangs``), the pod templates of workload objects (``workloads``:
Job, JobSet, MPIJob, ...), a node's Kubernetes state (``nodekube``), Queue objects
(``queuespec``), Dynamic Resource Allocation objects (``dra``: DeviceClasses, ResourceSlices,
ResourceClaims, a pod's claims, and the claim JSON binder writes), and the API server's grammar for quantities (``quantity``) and names
(``names``); ``fields`` reads a field of any shape without raising. The input is a plain dict as YAML or the API gives it; the output is a frozen value
or a list of ``Violation``s naming field, value and rule.

Pure and below the engine: it depends on nothing of ours but the wire contract (``phalanx_proto``);
the engine, the services and the CLI read objects through it (import-linter, ``pyproject.toml``).
"""

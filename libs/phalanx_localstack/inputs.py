"""The embedded stack's input files: the cluster file (which nodes to simulate) and the
workload file (which pods to submit). Read through ``phalanx_input`` like every other file a
command takes: ``Unreadable`` (an ``OSError``) when a file cannot be read as YAML, ``Invalid``
naming the field path when its shape is wrong. ``phalanx up``/``demo`` exit 2 and 1 for them.

Cluster file (``examples/clusters/2x8v100.yaml`` shows one)::

    nodes:                          # 1 to 100000 nodes
    - name: <node name>             # a DNS-1123 subdomain, unique
      labels: {<key>: <value>}      # Node labels, under the API server's rules
      topology: <file>              # relative to the cluster file
      gpuModel: <model>             # optional
      gpuMemoryMiB: <MiB per GPU>   # optional, 0 to 1048576
      migEnabled: <bool>            # optional
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from phalanx_input import Invalid, Unreadable, yaml_file
from phalanx_kubeobjects import names
from phalanx_proto.kubeapi import HOSTNAME_LABEL
from phalanx_topology.model import MAX_GPU_MEMORY_MIB

MAX_NODES = 100_000
"""The largest simulated cluster (``phalanx up --synthetic``; Kubernetes itself documents 5000)."""
MAX_CLUSTER_BYTES = 64 * 1024 * 1024
"""A cluster file of ``MAX_NODES`` nodes is about 25 MB."""
MAX_PODS = 150_000
"""Kubernetes' documented most pods per cluster."""


@dataclass(frozen=True)
class ClusterNode:
    name: str
    labels: dict[str, str]
    topology_file: str
    gpu_model: str = ""
    gpu_memory_mib: int = 0
    mig_enabled: bool = False
    advertise: str = ""
    """How the node's agent advertises its GPUs (topology-discovery's ``--advertise``): "" its
    default (patched into the Node status here), ``none`` for a node whose GPUs only a DRA
    driver's ResourceSlices offer (no ``nvidia.com/gpu`` in its allocatable)."""


class _Node(msgspec.Struct, forbid_unknown_fields=True,
            rename={"gpu_model": "gpuModel", "gpu_memory_mib": "gpuMemoryMiB", "mig_enabled": "migEnabled"}):
    name: str
    topology: str
    labels: dict[str, str] = {}
    gpu_model: str = ""
    gpu_memory_mib: Annotated[int, msgspec.Meta(ge=0, le=MAX_GPU_MEMORY_MIB)] = 0
    mig_enabled: bool = False
    advertise: Literal["", "node-status", "none"] = ""


class _Cluster(msgspec.Struct, forbid_unknown_fields=True):
    nodes: Annotated[list[_Node], msgspec.Meta(min_length=1, max_length=MAX_NODES)]


def convert(doc: Any, kind: type, where: str) -> Any:
    """``doc`` as ``kind`` (a msgspec Struct), or ``Invalid`` naming ``where`` (the file) and
    the field path (``nodes[0].gpuMemoryMiB``)."""
    try:
        return msgspec.convert(doc, kind)
    except msgspec.ValidationError as e:
        problem, _, path = str(e).partition(" - at `$")
        path = path.rstrip("`").lstrip(".")
        raise Invalid(f"{where}: {path}" if path else where, problem) from None


SIMULATED_ALLOCATABLE = {"cpu": "96", "memory": "768Gi", "ephemeral-storage": "3Ti", "pods": "110"}
"""What every simulated node offers besides GPUs (a DGX-class server; the kubelet's default
pod limit): the non-GPU filters check a simulated pod's requests against it."""


@dataclass(frozen=True)
class ClusterFile:
    nodes: tuple[ClusterNode, ...]

    @classmethod
    def load(cls, path: str | os.PathLike) -> ClusterFile:
        """Read a cluster file. ``Unreadable`` when it cannot be read; ``Invalid`` (its
        message starts with the file and the field path) when a field is wrong."""
        p = Path(path)
        try:
            docs = [d for d in yaml_file(p, limit=MAX_CLUSTER_BYTES) if d is not None]
        except Unreadable as e:
            raise Unreadable(f"cluster file {p}: {e}") from None
        if len(docs) != 1:
            raise Invalid(str(p), f"a cluster file holds one YAML document, not {len(docs)}")
        spec = convert(docs[0], _Cluster, str(p))
        nodes, seen = [], set()
        for i, n in enumerate(spec.nodes):
            at = f"{p}: nodes[{i}]"
            if not names.dns_subdomain(n.name):
                raise Invalid(f"{at}.name", f"{n.name[:80]!r} {names.SUBDOMAIN_RULE}")
            if n.name in seen:
                raise Invalid(f"{at}.name", f"{n.name!r} names two nodes")
            seen.add(n.name)
            bad = names.check_metadata({"labels": n.labels})
            if bad:
                raise Invalid(f"{at}.{bad[0].field.removeprefix('metadata.')}", f"{bad[0].value!r} {bad[0].rule}")
            topo = (p.parent / n.topology).resolve()
            if not topo.is_file():
                raise Invalid(f"{at}.topology", f"file {topo} does not exist")
            nodes.append(ClusterNode(n.name, dict(n.labels), str(topo), n.gpu_model, n.gpu_memory_mib,
                                     n.mig_enabled, n.advertise))
        return cls(tuple(nodes))

    def dump(self, path: str | os.PathLike) -> Path:
        """Write this cluster as a cluster file (topology paths absolute) that ``load`` reads back."""
        nodes = []
        for n in self.nodes:
            doc: dict[str, Any] = {"name": n.name, "labels": dict(n.labels), "topology": n.topology_file}
            if n.gpu_model:
                doc["gpuModel"] = n.gpu_model
            if n.gpu_memory_mib:
                doc["gpuMemoryMiB"] = n.gpu_memory_mib
            if n.mig_enabled:
                doc["migEnabled"] = True
            if n.advertise:
                doc["advertise"] = n.advertise
            nodes.append(doc)
        out = Path(path)
        out.write_text(yaml.dump({"nodes": nodes}, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                                 sort_keys=False))
        return out

    def node_objects(self) -> list[dict[str, Any]]:
        """The Node objects of the simulated cluster: Ready, schedulable, with
        ``SIMULATED_ALLOCATABLE`` (topology-discovery adds the GPU resources)."""
        return [{"apiVersion": "v1", "kind": "Node",
                 "metadata": {"name": n.name, "labels": {HOSTNAME_LABEL: n.name, **n.labels}},
                 "status": {"capacity": dict(SIMULATED_ALLOCATABLE), "allocatable": dict(SIMULATED_ALLOCATABLE),
                            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}
                for n in self.nodes]


def load_workload(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The Pods of a (multi-document) YAML workload file; a ``kind: List`` is unpacked, other
    kinds are left out. ``Unreadable`` when it cannot be read; ``Invalid`` naming the document
    and field when a document is not an object or a pod's metadata breaks the API server's
    rules (the simulated cluster accepts what a real one would)."""
    try:
        docs = yaml_file(path)
    except Unreadable as e:
        raise Unreadable(f"workload file {path}: {e}") from None
    pods: list[dict[str, Any]] = []
    for n, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        where = f"{path}#{n}"
        if not isinstance(doc, dict):
            raise Invalid(where, f"not a Kubernetes object (a {type(doc).__name__}, not a mapping)")
        if doc.get("kind") == "List":
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise Invalid(f"{where}: items", "must be a list of objects")
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    raise Invalid(f"{where}: items[{i}]", "must be a Kubernetes object (a mapping)")
                if item.get("kind") == "Pod":
                    pods.append(_pod(item, f"{where}: items[{i}]"))
        elif doc.get("kind") == "Pod":
            pods.append(_pod(doc, where))
        if len(pods) > MAX_PODS:
            raise Invalid(str(path), f"more than {MAX_PODS} pods (Kubernetes' most per cluster)")
    return pods


def load_queues(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, str]]]]:
    """The Queue objects and the Namespaces (name, labels) of a YAML file for the simulated
    cluster, each Queue checked as the API server would (``Invalid`` naming the document and
    field; the tree is gang-coordinator's to check, as in a real cluster)."""
    from phalanx_kubeobjects.queuespec import QueueObjectError, queue_from_object

    try:
        docs = yaml_file(path)
    except Unreadable as e:
        raise Unreadable(f"queues file {path}: {e}") from None
    queues, namespaces = [], []
    for n, doc in enumerate(docs, start=1):
        where = f"{path}#{n}"
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise Invalid(where, f"not a Kubernetes object (a {type(doc).__name__}, not a mapping)")
        if doc.get("kind") == "Queue":
            try:
                spec = queue_from_object(doc)
            except QueueObjectError as e:
                raise Invalid(where, str(e)) from None
            if spec.problem:
                raise Invalid(f"{where}: Queue/{spec.name}", spec.problem)
            queues.append(doc)
        elif doc.get("kind") == "Namespace":
            meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
            if not names.dns_label(meta.get("name")):
                raise Invalid(f"{where}: metadata.name", "a namespace's name is a DNS label")
            labels = meta.get("labels") or {}
            if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
                raise Invalid(f"{where}: metadata.labels", "a map of label to value")
            namespaces.append((meta["name"], dict(labels)))
    return queues, namespaces


def _pod(obj: dict[str, Any], where: str) -> dict[str, Any]:
    meta, spec = obj.get("metadata"), obj.get("spec")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise Invalid(f"{where}: metadata.name", "a pod needs a name")
    bad = names.check_metadata(meta)
    if bad:
        raise Invalid(f"{where}: {bad[0].field}", f"{bad[0].value!r} {bad[0].rule}")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        raise Invalid(f"{where}: spec.containers", "a pod needs a list of at least one container")
    if not all(isinstance(c, dict) for c in spec["containers"]):
        raise Invalid(f"{where}: spec.containers", "each container must be a mapping")
    return obj

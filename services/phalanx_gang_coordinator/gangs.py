"""Gang identity and member requests of the pods gang-coordinator sees.

The rules are ``phalanx_kubeobjects.gangs`` (docs/saga.md, "Gang identity and min-member"), the
same code ``phalanx validate`` runs on pod templates, timeout annotation included; this module
adds what only a running pod has: its priority (also carried on each member, with its
``preemptionPolicy``, for preemption: docs/preemption.md), and turns the rules' refusal into
``InvalidMember``.
"""

from __future__ import annotations

import dataclasses

import msgspec

from phalanx_kube.port import Pod
from phalanx_kubeobjects import gangs as rules
from phalanx_kubeobjects.gangs import GangIdentity
from phalanx_kubeobjects.requests import RequestError, Violation
from phalanx_proto.events import MemberSpec


class InvalidMember(ValueError):
    """The pod cannot be a gang member; ``violations`` name field, value and rule."""

    def __init__(self, violations: tuple[Violation, ...]) -> None:
        self.violations = violations
        super().__init__("; ".join(str(v) for v in violations))


def identity(pod: Pod) -> GangIdentity:
    """The gang of ``pod``, with its priority. Raises ``InvalidMember`` for a bad min-member or
    timeout value."""
    try:
        g = rules.identify(pod.namespace, pod.name, pod.labels, pod.annotations, pod.raw.get("spec"))
    except RequestError as e:
        raise InvalidMember(e.violations) from None
    return dataclasses.replace(g, priority=rules.pod_priority(pod.raw.get("spec")))


def member_spec(pod: Pod) -> MemberSpec:
    """The wire request of one pod, parsed by ``phalanx_kubeobjects.gangs.gpu_member`` (whole,
    multi-GPU, TDM, MIG, RDMA; a pod without GPU is no member). Raises ``InvalidMember`` with
    every violation."""
    try:
        req = rules.gpu_member(pod.raw)
    except RequestError as e:
        raise InvalidMember(e.violations) from None
    except Exception as e:  # noqa: BLE001 - a pod of a shape the parser did not expect: refuse it, say why
        raise InvalidMember((Violation("spec", type(e).__name__,
                                       f"the pod's spec could not be read as a Kubernetes pod ({e})"),)) from None
    spec = pod.raw.get("spec")
    return msgspec.structs.replace(req.member_spec(pod.ref), priority=rules.pod_priority(spec),
                                   preemption_policy=rules.preemption_policy(spec))

"""A stand-in kubelet for one node of the test control plane: it runs the pods bound there.

The chart's hook Jobs (``phalanx bus kube-secrets``) must really run during ``helm install``,
``helm upgrade`` and ``helm uninstall``, and kwok only pretends to run containers. The test
therefore steers the hook pods (values ``credentials.job.nodeSelector``/``tolerations``) onto a
node that kwok does not manage, and this runner plays that node's kubelet: for each pod bound
to it, it runs the container's command and arguments with the container's environment
(``value`` and ``fieldRef`` entries) — ``phalanx`` being this checkout's CLI, the code the image
carries — authenticated as the pod's ServiceAccount (a token from the TokenRequest API, so the
hook's own RBAC is what is exercised), then writes the outcome into the pod's status the way a
kubelet does (phase ``Succeeded``/``Failed`` and the container's terminated state). The Job
controller, Helm's hook waiter and the garbage collector take it from there.

What the commands printed is kept in ``outputs`` (the test checks that no secret was printed).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from kubeharness import REPO, ControlPlane, fake_gpu_node


def runner_node(name: str, taint_key: str) -> dict:
    """A Node that kwok leaves alone (no kwok annotation), tainted so only the hook pods, which
    tolerate ``taint_key``, are bound to it."""
    node = fake_gpu_node(name, gpus=0, labels={taint_key: name}, kwok=False)
    node["spec"] = {"taints": [{"key": taint_key, "value": name, "effect": "NoSchedule"}]}
    return node


@dataclass
class HookRunner:
    plane: ControlPlane
    namespace: str
    node: str
    outputs: list[tuple[str, int, str]] = field(default_factory=list)
    """(pod name, exit code, what it printed) of every pod run, in order."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _seen: set[str] = field(default_factory=set)

    def __enter__(self) -> HookRunner:
        self._thread = threading.Thread(target=self._loop, name=f"hook-runner-{self.node}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _loop(self) -> None:
        api = self.plane.api
        while not self._stop.wait(0.3):
            try:
                pods = api.get(f"/api/v1/namespaces/{self.namespace}/pods",
                               query={"fieldSelector": f"spec.nodeName={self.node}"})["items"]
            except Exception:  # noqa: BLE001 - the next round retries
                continue
            for pod in pods:
                uid = pod["metadata"]["uid"]
                if uid not in self._seen and pod["status"].get("phase", "Pending") == "Pending":
                    self._seen.add(uid)
                    self._run(pod)

    def _env(self, pod: dict, container: dict) -> dict[str, str]:
        fields = {"metadata.namespace": pod["metadata"]["namespace"], "metadata.name": pod["metadata"]["name"],
                  "spec.nodeName": self.node}
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PHALANX_", "KUBERNETES_")) and k != "KUBECONFIG"}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            elif "fieldRef" in e.get("valueFrom", {}):
                env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        sa = pod["spec"].get("serviceAccountName", "default")
        token = self.plane.service_account_token(self.namespace, sa, expiration_s=600)
        env["KUBECONFIG"] = str(self.plane.kubeconfig_for(f"hook-{sa}", token))
        env["PYTHONPATH"] = os.pathsep.join(str(REPO / d) for d in ("proto", "libs", "services"))
        return env

    def _run(self, pod: dict) -> None:
        name = pod["metadata"]["name"]
        (container,) = pod["spec"]["containers"]
        argv = [*container.get("command", []), *container.get("args", [])]
        assert argv[0] == "phalanx", f"the runner runs only the phalanx CLI, not {argv!r}"
        started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            done = subprocess.run([sys.executable, "-m", "phalanx_cli.main", *argv[1:]], env=self._env(pod, container),
                                  capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            code, printed = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            code, printed = 124, f"timed out: {e}"
        self.outputs.append((name, code, printed))
        finished = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                      "startedAt": started, "finishedAt": finished}
        status = {"status": {
            "phase": "Succeeded" if code == 0 else "Failed", "startTime": started,
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
            "containerStatuses": [{"name": container["name"], "image": container["image"], "imageID": "",
                                   "ready": False, "restartCount": 0, "started": False,
                                   "state": {"terminated": terminated}}]}}
        for attempt in range(5):
            try:
                self.plane.api.patch(f"/api/v1/namespaces/{self.namespace}/pods/{name}/status", status)
                return
            except Exception:  # noqa: BLE001 - a conflict with the job controller's own writes: retry
                if attempt == 4:
                    raise
                time.sleep(0.5)

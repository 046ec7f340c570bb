"""``phalanx validate FILE...``: check pod specs before they reach the cluster.

Reads YAML files (multi-document; ``-`` is stdin) holding Pods, Jobs, JobSets
(``spec.replicatedJobs[*].template.spec.template``), Kubeflow MPIJobs, LeaderWorkerSets
(leader and worker templates; each group is a gang), Deployment-like objects or bare
``spec:`` snippets, and checks every pod template with
``phalanx_kubeobjects.requests`` - the same code gang-coordinator runs. Queue objects
(``scheduling.phalanx.io/v1alpha1``) are checked against the CRD's rules and, together, as a
tree (a parent among the files, no cycle, children's quotas within the parent's). ``--gpu-model`` adds the
node-side checks for one GPU model (MIG support, profiles, AMD whole-GPU only).

Prints one ``OK`` line per pod template on stdout; invalid templates go to stderr with one
line per violation. Exit 0 when everything is valid; 1 when something was read but is invalid
(a rule broken, a document that is not an object, a field of the wrong shape); 2 when a file
cannot be read: missing, larger than 8 MiB, not UTF-8 text, not YAML, or YAML that Phalanx
refuses to build (an alias bomb, nesting deeper than 64, a self-referencing structure; see
``phalanx_input``), or when it holds no objects. Names and values from the file are printed
with control characters escaped.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any

import msgspec

from phalanx_cli.terminal import safe
from phalanx_engine.gpumodel import check_gpu_model
from phalanx_input import Unreadable, yaml_file
from phalanx_kubeobjects.queuespec import QueueObjectError, queue_from_object
from phalanx_kubeobjects.workloads import check_object, gang_check
from phalanx_proto.queues import shown
from phalanx_rules.queues import tree_problems


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="check pod specs, JobSets, MPIJobs and LeaderWorkerSets for Phalanx",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE", help="YAML file(s); '-' reads stdin")
    p.add_argument("--gpu-model", default="", help="also check against this GPU model, e.g. 'NVIDIA A100-SXM4-40GB'")
    p.add_argument("--gpu-vendor", default="nvidia", choices=("nvidia", "amd", "ppu"),
                   help="vendor of --gpu-model (default nvidia)")
    p.add_argument("--gpu-memory-mib", type=int, default=0, help="memory of one GPU of --gpu-model, in MiB")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, *, stdin: IO[Any] | None = None, out: IO[str] | None = None,
        err: IO[str] | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    code = 0
    queues: dict = {}
    for path in args.files:
        try:
            docs = [(n, doc) for n, doc in enumerate(yaml_file(path, stdin=stdin), start=1) if doc is not None]
        except Unreadable as e:
            print(safe(f"{path}: cannot read: {e}"), file=err)
            code = 2
            continue
        if not docs:
            print(safe(f"{path}: no Kubernetes objects"), file=err)
            code = 2
            continue
        for n, doc in docs:
            if isinstance(doc, dict) and doc.get("kind") == "Queue":
                code = max(code, _queue(f"{path}#{n}", doc, queues, out, err))
            else:
                code = max(code, _check(f"{path}#{n}", doc, args, out, err))
    return max(code, _tree(queues, out, err))


def _queue(where: str, doc: dict, queues: dict, out: IO[str], err: IO[str]) -> int:
    """One Queue object against the CRD's rules; kept for the tree check."""
    try:
        spec = queue_from_object(doc)
    except QueueObjectError as e:
        print(safe(f"{where}: INVALID Queue: {e}"), file=err)
        return 1
    if spec.problem:
        print(safe(f"{where}: INVALID Queue/{spec.name}: {spec.problem}"), file=err)
        return 1
    queues[spec.name] = (where, spec)
    limit = "no limit" if spec.limit is None else f"limit {shown(spec.limit)}"
    print(safe(f"{where}: OK Queue/{spec.name}: quota {shown(spec.quota)} GPUs, {limit}, overQuotaWeight "
               f"{spec.over_quota_weight:g}" + (f", parent {spec.parent}" if spec.parent else "")), file=out)
    return 0


def _tree(queues: dict, out: IO[str], err: IO[str]) -> int:
    """The Queues of all the files as one tree (a parent outside the files is only warned of)."""
    code = 0
    for name, problem in sorted(tree_problems(spec for _, spec in queues.values()).items()):
        where, spec = queues[name]
        if problem.startswith("spec.parent: queue") and "does not exist" in problem:
            print(safe(f"  warning: Queue/{name}: parent {spec.parent!r} is not among these files: it must exist "
                       "in the cluster"), file=out)
            continue
        code = 1
        print(safe(f"{where}: INVALID Queue/{name}: {problem}"), file=err)
    return code


def _check(where: str, doc: Any, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """Print the verdict on one document; its exit code (0 valid or skipped, 1 invalid)."""
    if not isinstance(doc, dict):
        print(safe(f"{where}: INVALID: not a Kubernetes object (a {type(doc).__name__}, not a mapping)"), file=err)
        return 1
    checks = check_object(doc)
    if checks is None:
        kind = doc.get("kind")
        print(safe(f"{where}: SKIP {kind if isinstance(kind, str) and kind else '(no kind)'}: holds no pods"[:300]),
              file=out)
        return 0
    code = 0
    gang = gang_check(doc)
    for c in checks:
        violations = c.violations
        if c.request is not None and args.gpu_model:
            violations = check_gpu_model(c.request, args.gpu_model, vendor=args.gpu_vendor,
                                         memory_mib=args.gpu_memory_mib)
        if violations:
            code = 1
            print(safe(f"{where}: INVALID {c.where}:"), file=err)
            for v in violations:
                print(safe(f"  - {v}"), file=err)
            continue
        if c.request is None:
            print(safe(f"{where}: SKIP {c.where}: {'; '.join(c.warnings)}"), file=out)
            continue
        request = msgspec.structs.replace(c.request, min_member=0) if gang is not None else c.request
        print(safe(f"{where}: OK {c.where}: {request.describe()}"), file=out)
        for w in c.warnings:
            print(safe(f"  warning: {w}"), file=out)
    if gang is not None:
        size = f"{gang.members} pod{'s' if gang.members != 1 else ''}" if gang.members else "size not declared"
        print(safe(f"  gang {gang.gang_id}: {size} ({gang.how})"), file=out)
        if gang.violations:
            code = 1
            print(safe(f"{where}: INVALID gang {gang.gang_id}:"), file=err)
            for v in gang.violations:
                print(safe(f"  - {v}"), file=err)
    return code

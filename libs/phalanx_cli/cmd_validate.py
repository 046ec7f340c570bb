"""``phalanx validate FILE...``: check pod specs before they reach the cluster.

Reads YAML files (multi-document; ``-`` is stdin) holding Pods, Jobs, JobSets
(``spec.replicatedJobs[*].template.spec.template``), Kubeflow MPIJobs, Deployment-like
objects or bare ``spec:`` snippets, and checks every pod template with
``phalanx_engine.requests`` - the same code gang-coordinator runs. ``--gpu-model`` adds the
node-side checks for one GPU model (MIG support, profiles, AMD whole-GPU only).

Prints one ``OK`` line per pod template on stdout; invalid templates go to stderr with one
line per violation. Exit 0 when everything is valid, 1 when something is invalid, 2 when a
file cannot be read or parsed or holds no objects.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import yaml

from phalanx_engine.requests import check_gpu_model, check_object


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="check pod specs, JobSets and MPIJobs for Phalanx",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE", help="YAML file(s); '-' reads stdin")
    p.add_argument("--gpu-model", default="", help="also check against this GPU model, e.g. 'NVIDIA A100-SXM4-40GB'")
    p.add_argument("--gpu-vendor", default="nvidia", choices=("nvidia", "amd", "ppu"),
                   help="vendor of --gpu-model (default nvidia)")
    p.add_argument("--gpu-memory-mib", type=int, default=0, help="memory of one GPU of --gpu-model, in MiB")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, *, stdin: TextIO | None = None, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    code = 0
    for path in args.files:
        try:
            docs = list(_documents(path, stdin or sys.stdin))
        except (OSError, yaml.YAMLError) as e:
            print(f"{path}: cannot read: {_oneline(e)}", file=err)
            code = 2
            continue
        if not docs:
            print(f"{path}: no Kubernetes objects", file=err)
            code = 2
            continue
        for n, doc in docs:
            where = f"{path}#{n}"
            if not isinstance(doc, dict):
                print(f"{where}: not a Kubernetes object (a {type(doc).__name__})", file=err)
                code = 2
                continue
            checks = check_object(doc)
            if checks is None:
                print(f"{where}: SKIP {doc.get('kind') or '(no kind)'}: holds no pods", file=out)
                continue
            for c in checks:
                violations = c.violations
                if c.request is not None and args.gpu_model:
                    violations = check_gpu_model(c.request, args.gpu_model, vendor=args.gpu_vendor,
                                                 memory_mib=args.gpu_memory_mib)
                if violations:
                    code = max(code, 1)
                    print(f"{where}: INVALID {c.where}:", file=err)
                    for v in violations:
                        print(f"  - {v}", file=err)
                    continue
                assert c.request is not None
                print(f"{where}: OK {c.where}: {c.request.describe()}", file=out)
                for w in c.warnings:
                    print(f"  warning: {w}", file=out)
    return code


def _documents(path: str, stdin: TextIO) -> Iterator[tuple[int, Any]]:
    if path == "-":
        text = stdin.read()
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    for n, doc in enumerate(yaml.safe_load_all(text), start=1):
        if doc is not None:
            yield n, doc


def _oneline(e: BaseException) -> str:
    return " ".join(str(e).split())

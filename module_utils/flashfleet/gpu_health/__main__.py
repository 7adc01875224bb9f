"""`python -m flashfleet.gpu_health`: the health check from the command line, on this host or on a
recorded directory (tests/benchmarks/gpu_health_record.sh writes one).

    python -m flashfleet.gpu_health [--gpus 0,1] [--level 1] [--from DIR] [--set name=value ...]
                                    [--runs-root DIR] [--probe-python PY] [--json]

Exit 0: every GPU passes; 1: a GPU (or the all-reduce) fails, or one is quarantined; 78: a bad
setting. Without --runs-root nothing is read from or written to a quarantine.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..contract.quarantine import QuarantineError
from . import gather
from .host import check_host
from .settings import resolve


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashfleet.gpu_health", description=__doc__.splitlines()[0])
    p.add_argument("--gpus", default="", help="GPU indices (nvidia-smi's), comma-separated; default every GPU")
    p.add_argument("--level", type=int, default=1, help="1: quick; 2-4: DCGM's longer levels and the longer probe")
    p.add_argument("--budget-s", type=float, default=120, help="the whole check's time budget, seconds")
    p.add_argument("--from", dest="recorded", default="", help="judge the outputs recorded in this directory")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a threshold")
    p.add_argument("--runs-root", default=None, help="the runs' directory: read and write its GPU quarantine")
    p.add_argument("--probe-python", default=None, help="the trainer venv's python (runs the matmul/all-reduce)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        overrides = dict(s.split("=", 1) for s in a.set)
        resolve(overrides)
        indices = [int(i) for i in a.gpus.split(",") if i.strip()] or None
    except ValueError as exc:
        print(f"gpu_health: {exc}", file=sys.stderr)
        return 78
    raw = gather.recorded(a.recorded, a.level) if a.recorded else None
    try:
        result = check_host(a.runs_root, indices, a.level, a.budget_s, a.probe_python, overrides,
                            raw=raw)
    except (QuarantineError, ValueError) as exc:
        print(f"gpu_health: {exc}", file=sys.stderr)
        return 78
    print(json.dumps(result, default=str) if a.json else "\n".join(result["lines"]))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

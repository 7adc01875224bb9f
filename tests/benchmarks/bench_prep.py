"""Steps of the one-GPU trainer as `dflash-train` runs them (target and drafter in one process,
Trainer.train_step), without checkpoints: one JSON line per step, then the means over the steps
after --warmup. Whatever flashfleet_trainer is on PYTHONPATH is measured (a copy of an older commit
for a before/after pair).

    python tests/benchmarks/bench_prep.py [--warmup 2] [--sync-check] -- <dflash-train flags>

--sync-check: afterwards, one more step under torch.cuda.set_sync_debug_mode("warn"), printing
where it synchronizes the host with the GPU (file:line and count).
"""

import argparse
import collections
import json
import statistics
import sys
import warnings

import torch
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.metrics import Status
from flashfleet_trainer.preflight import preflight
from flashfleet_trainer.trainer import Rank, Trainer

KEYS = ("drafter_rows_per_s", "step_rows_per_s", "step_s", "drafter_s", "target_s", "drafter_idle_frac", "loss")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--sync-check", action="store_true")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    a = p.parse_args()
    args = parse_args([x for x in a.rest if x != "--"])
    facts = preflight(args)
    t = Trainer(args, facts, Status.null(), log=lambda s: None, rank=Rank())
    t.setup()
    recs = []
    for _ in range(args.max_steps):
        r = t.train_step()
        recs.append(r)
        print(json.dumps({k: r[k] for k in ("step",) + KEYS}), flush=True)
    timed = recs[a.warmup:]
    out = {k: statistics.mean(r[k] for r in timed) for k in KEYS}
    out["rows_per_s_delivered"] = sum(r["rows"] for r in timed) / sum(r["step_s"] for r in timed)
    out["rows"] = statistics.mean(r["rows"] for r in timed)
    out["peak_gib"] = max(r["peak_mem_bytes"] for r in timed) / 2**30
    out["ahead"] = getattr(Trainer, "PREPARE_AHEAD", None)
    print("SUMMARY " + json.dumps(out), flush=True)
    if a.sync_check:
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            t.train_step()
        torch.cuda.set_sync_debug_mode(0)
        where = collections.Counter(f"{w.filename}:{w.lineno}" for w in ws if "synchroniz" in str(w.message))
        print("SYNCS " + json.dumps(where.most_common()), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

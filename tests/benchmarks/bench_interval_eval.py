"""What an interval evaluation costs a multi-process run: the drafter ranks training on while a
target worker evaluates (Trainer.EVAL_WAITS = False), against rank 0 waiting for it (True), against
no interval evaluation at all.

    python tests/benchmarks/bench_interval_eval.py                       # 2 targets + 1 drafter
    python tests/benchmarks/bench_interval_eval.py --targets 1 --drafters 2 --repeats 2

The target and data are `dflash-tiny`'s defaults (built once into --assets); the run is the
demo's shape (block 8, 2 draft layers), every --eval-interval steps an evaluation of
--eval-interval-prompts prompts x 64 tokens, the time budget lifted (every interval evaluates),
no final evaluation. Each variant is one dflash-train process tree; what is compared is the
training loop's wall time, from the first step's metrics record to the last one's (so start-up
is left out and an evaluation rank 0 waits for is in), and, less sensitive to a shared machine's
load, what the loop took beyond (steps - 1) x its median gap between step records: the time the
evaluations cost the training (the `none` variant's is the noise floor).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Set in this process and, through the environment, in the spawned drafter ranks, which import
# this file as their main module (multiprocessing's spawn start method).
if os.environ.get("BENCH_EVAL_WAITS") is not None:
    from flashfleet_trainer.trainer import Trainer

    Trainer.EVAL_WAITS = os.environ["BENCH_EVAL_WAITS"] == "1"
    Trainer.EVAL_BUDGET = 1.0


def run_variant(assets: Path, out: Path, variant: str, a) -> dict:
    argv = ["--target-model", str(assets / "model"), "--data-dir", str(assets / "data"), "--output-dir", str(out),
            "--target-gpus", ",".join(["cpu"] * a.targets), "--drafter-gpus", ",".join(["cpu"] * a.drafters),
            "--block-size", "8", "--num-draft-layers", "2", "--max-steps", str(a.steps), "--save-interval", "100000",
            "--eval-num-prompts", "0", "--eval-interval", "0" if variant == "none" else str(a.eval_interval),
            "--eval-interval-prompts", str(a.eval_interval_prompts), "--resume", "never"]
    env = {**os.environ, "BENCH_EVAL_WAITS": "1" if variant == "wait" else "0"}
    subprocess.run([sys.executable, __file__, "--train", *argv], env=env, check=True, capture_output=True, text=True)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "loss" in r]
    evals = [r for r in recs if r.get("eval") == "interval"]
    gaps = [b["time"] - a["time"] for a, b in zip(steps, steps[1:], strict=False)]
    loop = steps[-1]["time"] - steps[0]["time"]
    # what the loop took beyond its typical step (the median gap between step records): the
    # evaluations' cost, read within one run, so a shared machine's load level cancels out
    return {"loop_s": loop, "excess_s": loop - len(gaps) * statistics.median(gaps), "evals": len(evals),
            "eval_s": sum(r["eval_s"] for r in evals), "tau": [round(r["tau_pooled"], 3) for r in evals]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--assets", type=Path, default=Path(tempfile.gettempdir()) / "bench-interval-eval-tiny")
    p.add_argument("--targets", type=int, default=2)
    p.add_argument("--drafters", type=int, default=1)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval-interval", type=int, default=10)
    p.add_argument("--eval-interval-prompts", type=int, default=8)
    p.add_argument("--repeats", type=int, default=1)
    a = p.parse_args()
    if not (a.assets / "model" / "config.json").is_file():
        from flashfleet_trainer.tiny import build

        build(a.assets, log=lambda s: None)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            for variant in ("none", "train-on", "wait"):
                res = run_variant(a.assets, Path(tmp) / f"{variant}-{r}", variant, a)
                results.setdefault(variant, []).append(res)
                print(f"{variant:9s} repeat {r}: loop {res['loop_s']:.1f} s (beyond its median step: "
                      f"{res['excess_s']:.1f} s), {res['evals']} interval evaluations "
                      f"({res['eval_s']:.1f} s in all, tau {res['tau']})", flush=True)
    print(f"{a.targets} target worker(s) + {a.drafters} drafter rank(s), {a.steps} steps, an evaluation every "
          f"{a.eval_interval}: medians over {a.repeats} repeat(s)")
    for variant, rs in results.items():
        med = {k: statistics.median(x[k] for x in rs) for k in ("loop_s", "excess_s", "eval_s")}
        print(f"  {variant:9s} loop {med['loop_s']:.1f} s, beyond its median step {med['excess_s']:.1f} s, "
              f"evaluations {med['eval_s']:.1f} s")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--train"]:  # one variant's dflash-train (run_variant)
        from flashfleet_trainer.cli import main as train_main

        sys.exit(train_main(sys.argv[2:]))
    main()

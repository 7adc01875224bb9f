"""`dflash-train --plan`: measure each side once, then choose the split of a node's devices.

Which side is the bottleneck depends on anchor density (dflash.md, "GPU topology and
throughput"): the drafter consumes `rows_per_token` draft rows per target token, a property of
the data and of --max-anchors/--block-size, not of the hardware. So the planner measures, on the
real model and data, in one process:

    Rt  target tokens/s on one device (a replica on the first --target-gpus entry)
    Rd  drafter rows/s on one device (the first --drafter-gpus entry), the full training step
    rows_per_token from the same micro-batches

and with k of the node's n devices serving targets and n-k training, the drafter can do at most
min(k * Rt * rows_per_token, (n-k) * Rd) rows/s. It prints that for every k and the best one.
With --drafter-serves-target a target-bound split's drafter devices also run the target while
they would wait: each drafter device of a split that feeds it r < Rd rows/s from the k targets
divides its time between training (x / Rd) and serving (x - r rows' worth of target work,
(x - r) / (Rt * rows_per_token)), so x = Rd (Rt * rows_per_token + r) / (Rt * rows_per_token + Rd).
The table gives that figure beside each split; the advice takes the better of the two.
A target-bound best split also gets its headroom: the targets' work per step does not depend on
the anchors, so the drafters could train (n-k) Rd / (k Rt rows_per_token) times the draft rows per
target token (a larger --max-anchors) before they become the bound. Whether more anchors per
sequence train a better drafter is the user's call; the planner only says what fits.
It assumes devices are alike and that the hidden-state copy between devices is free (on one
NVLink node it is small next to either side's compute). The first step is a warm-up, not counted.
"""

import copy
import dataclasses

from .feed import InProcessFeed
from .metrics import Status
from .preflight import Plan
from .trainer import Rank, Trainer


def node_devices(plan: Plan) -> list[str]:
    """The node's devices as the user listed them: distinct GPUs, or every `cpu` entry."""
    devs = plan.target_devices + plan.drafter_devices
    if all(d == "cpu" for d in devs):
        return devs
    return sorted({d for d in devs if d != "cpu"}, key=lambda d: int(d.split(":")[1]))


def best_split(n: int, target_tok_s: float, drafter_rows_s: float, rows_per_token: float) -> list[dict]:
    """One row per k = target devices (1..n-1): the drafter rows/s that split allows, its bound, and
    the rows/s with --drafter-serves-target (the module docstring's x, times the drafters)."""
    rows = []
    one_target = target_tok_s * rows_per_token  # rows/s one target device can feed
    for k in range(1, n):
        supply = k * one_target  # rows/s the targets can feed
        demand = (n - k) * drafter_rows_s  # rows/s the drafters can train
        fed = supply / (n - k)  # each drafter device's share
        serving = (n - k) * drafter_rows_s * (one_target + fed) / (one_target + drafter_rows_s)
        rows.append({"targets": k, "drafters": n - k, "drafter_rows_per_s": min(supply, demand),
                     "bound": "target" if supply < demand else "drafter",
                     "demand_rows_per_s": demand,
                     "serving_rows_per_s": max(min(supply, demand), min(serving, demand))})
    return rows


def anchor_headroom(row: dict) -> float:
    """How many times the draft rows per target token a target-bound split's drafters could train
    in the same time (the drafters' demand over the targets' supply); 1.0 when the drafters bound it."""
    if row["bound"] != "target" or row["drafter_rows_per_s"] <= 0:
        return 1.0
    return row["demand_rows_per_s"] / row["drafter_rows_per_s"]


def headroom_line(row: dict, max_anchors: int, peak_gib: float, serve: bool) -> str | None:
    """The advice line for a split whose drafters would wait on the targets; None when they would
    not (within a few percent, about the spread of the planner's own measurement)."""
    headroom = anchor_headroom(row)
    if headroom < 1.05:
        return None
    return (f"plan: at {row['targets']} target + {row['drafters']} drafter the targets are the bound: the drafters "
            f"could train {headroom:.1f}x the draft rows per target token in the same time (--max-anchors "
            f"{max_anchors} -> about {int(max_anchors * headroom)}, where the sequences have room for them; the "
            f"drafter's peak, {peak_gib:.1f} GiB now, grows with its rows; --plan again with it re-chooses the split)"
            + ("; that is the idle time --drafter-serves-target fills instead: take one or the other" if serve else ""))


def run_plan(args, plan: Plan, log) -> int:
    """Measure one target and one drafter in this process, log the table and the best split. Writes nothing."""
    a = copy.copy(args)
    a.resume, a.max_steps, a.eval_num_prompts = "never", args.plan_steps + 1, 0
    one = dataclasses.replace(plan, target_devices=plan.target_devices[:1], drafter_devices=plan.drafter_devices[:1])
    trainer = Trainer(a, one, Status.null(), log=lambda s: None, rank=Rank())
    trainer.setup()
    assert isinstance(trainer.feed, InProcessFeed)
    recs = [trainer.train_step() for _ in range(a.max_steps)][1:]  # the first step warms up (and compiles)
    tokens = sum(r["target_tokens"] for r in recs)
    rows = sum(r["rows"] for r in recs)
    rt = tokens / max(sum(r["target_s"] for r in recs), 1e-9)
    rd = rows / max(sum(r["drafter_s"] for r in recs), 1e-9)
    rpt = rows / max(tokens, 1)
    peak = max(r["peak_mem_bytes"] for r in recs) / 2**30
    devs = node_devices(plan)
    log(f"plan: measured {len(recs)} step(s) after a warm-up; target on {one.target_devices[0]}: {rt:,.0f} tokens/s; "
        f"drafter on {one.drafter_devices[0]}: {rd:,.0f} rows/s (peak {peak:.1f} GiB); "
        f"{rpt:.3f} draft rows per target token ({rows / len(recs):,.0f} rows, {tokens / len(recs):,.0f} tokens "
        "per step)")
    if len(devs) < 2:
        both = 1 / (1 / max(rt * rpt, 1e-9) + 1 / max(rd, 1e-9))
        log(f"plan: one device ({devs[0]}): target and drafter take turns on it: about {both:,.0f} drafter rows/s; "
            "list more devices in --target-gpus/--drafter-gpus to plan a split")
        return 0
    table = best_split(len(devs), rt, rd, rpt)
    for row in table:
        serving = (f"; {row['serving_rows_per_s']:,.0f} with --drafter-serves-target"
                   if row["serving_rows_per_s"] > row["drafter_rows_per_s"] else "")
        log(f"plan:   {row['targets']} target + {row['drafters']} drafter: {row['drafter_rows_per_s']:,.0f} "
            f"drafter rows/s ({row['bound']}-bound){serving}")
    best = max(table, key=lambda r: r["serving_rows_per_s"])
    k, serve = best["targets"], best["serving_rows_per_s"] > best["drafter_rows_per_s"]
    if devs[0] == "cpu":
        flags = f"--target-gpus {','.join(['cpu'] * k)} --drafter-gpus {','.join(['cpu'] * (len(devs) - k))}"
    else:
        ids = [d.split(":")[1] for d in devs]
        flags = f"--target-gpus {','.join(ids[:k])} --drafter-gpus {','.join(ids[k:])}"
    if serve:
        flags += " --drafter-serves-target"
    bound = "the drafters serving too" if serve else f"{best['bound']}-bound"
    log(f"plan: best split of {len(devs)} device(s): {k} target + {len(devs) - k} drafter, about "
        f"{best['serving_rows_per_s']:,.0f} drafter rows/s ({bound}): {flags}")
    line = headroom_line(best, args.max_anchors, peak, serve)
    if line:
        log(line)
    if serve:
        log(f"plan: with --drafter-serves-target each drafter device also holds a target replica: it needs room "
            f"for one beside the drafter's peak of {peak:.1f} GiB")
    return 0

"""`dflash-train --plan`: measure each side once, then choose the split of a node's devices.

Which side is the bottleneck depends on anchor density (dflash.md, "GPU topology and
throughput"): the drafter consumes `rows_per_token` draft rows per target token, a property of
the data and of --max-anchors/--block-size, not of the hardware. So the planner measures, on the
real model and data, in one process:

    Rt  target tokens/s on one device (a replica on the first --target-gpus entry)
    Rd  drafter rows/s on one device (the first --drafter-gpus entry), the full training step of
        the run's own --drafter-kind (DFlash 2's convolutions, selector and selector loss included)
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

A GPU the host's quarantine holds (flashfleet.contract.quarantine: beside the runs, the parent of
--output-dir; a failed health check or a diagnosed GPU fault put it there) is left out of the plan,
named with why: the plan is made, and measured, on the devices a run may use.

With --target-servers the target runs in vLLM servers of --server-gpus devices each (a server's
tensor-parallel x data-parallel size), and a drafter device cannot serve. Decision: the planner
still plans from measured rates only, so it needs the servers running; Rt is then the target
tokens/s through ONE server (the first URL), from the same real training steps fed by that server
with one micro-batch in flight (so its seconds are the server's busy time, counted once), Rd and
rows_per_token as above. The node is the servers' devices and the listed drafter devices,
n = len(servers) x server_gpus + len(--drafter-gpus), and every k servers that leave a drafter
device (k x server_gpus < n) gives min(k x Rt x rows_per_token, (n - k x server_gpus) x Rd):
best_split with per_target = server_gpus. Its advice names the number of `vllm.servers` entries
and the --drafter-gpus. A server's Rt at that concurrency is a floor for one that several drafter
ranks with deeper queues keep busier; rates measured on a CPU server are no GPU estimate.
"""

import dataclasses
import os

from flashfleet.contract import quarantine

from .errors import ConfigError
from .feed import InProcessFeed
from .metrics import Status
from .preflight import StartFacts
from .trainer import Rank, Trainer
from .vllm_target import VllmFeed


def node_devices(facts: StartFacts) -> list[str]:
    """The node's devices as the user listed them: distinct GPUs, or every `cpu` entry."""
    devs = facts.target_devices + facts.drafter_devices
    if all(d == "cpu" for d in devs):
        return devs
    return sorted({d for d in devs if d != "cpu"}, key=lambda d: int(d.split(":")[1]))


def device_uuid(dev: str) -> str:
    """The UUID of a listed device ('cuda:3'), as nvidia-smi prints it."""
    import torch

    return quarantine.normalize_uuid(str(torch.cuda.get_device_properties(int(dev.split(":")[1])).uuid))


def without_quarantined(facts: StartFacts, output_dir: str | None, log, uuid_of=device_uuid) -> StartFacts:
    """facts with the host's quarantined GPUs left out of both sides, each named in a line; the
    quarantine is the one beside the runs (the parent of output_dir). ConfigError when a side is left
    with no device."""
    if not output_dir:
        return facts
    doc = quarantine.read(quarantine.path_for(os.path.dirname(os.path.abspath(output_dir))))
    held = quarantine.quarantined(doc)
    if not held:
        return facts
    out = {}
    for dev in dict.fromkeys(facts.target_devices + facts.drafter_devices):
        if dev != "cpu" and uuid_of(dev) in held:
            out[dev] = held[uuid_of(dev)]
            log(f"plan: {dev} is quarantined on this host, left out of the plan: {quarantine.describe(out[dev])}")
    if not out:
        return facts
    target = [d for d in facts.target_devices if d not in out]
    drafter = [d for d in facts.drafter_devices if d not in out]
    if not target or not drafter:
        side = "--target-gpus" if not target else "--drafter-gpus"
        raise ConfigError(f"every device of {side} is quarantined ({', '.join(out)})",
                          "list other GPUs, or clear the quarantine after fixing them (train.yml -e clear_quarantine=UUID)")
    return dataclasses.replace(facts, target_devices=target, drafter_devices=drafter)


def best_split(n: int, target_tok_s: float, drafter_rows_s: float, rows_per_token: float,
               per_target: int = 1, serving: bool = True) -> list[dict]:
    """One row per k = targets of `per_target` devices each that leave a drafter device (k x per_target
    < n): the drafter rows/s that split allows, its bound, and the rows/s with --drafter-serves-target
    (the module docstring's x, times the drafters; the plain figure where `serving` is False: a vLLM
    server's drafter devices hold no replica)."""
    rows = []
    one_target = target_tok_s * rows_per_token  # rows/s one target can feed
    for k in range(1, (n - 1) // per_target + 1):
        drafters = n - k * per_target
        supply = k * one_target  # rows/s the targets can feed
        demand = drafters * drafter_rows_s  # rows/s the drafters can train
        fed = supply / drafters  # each drafter device's share
        serve = drafters * drafter_rows_s * (one_target + fed) / (one_target + drafter_rows_s) if serving else 0.0
        rows.append({"targets": k, "drafters": drafters, "drafter_rows_per_s": min(supply, demand),
                     "bound": "target" if supply < demand else "drafter",
                     "demand_rows_per_s": demand,
                     "serving_rows_per_s": max(min(supply, demand), min(serve, demand))})
    return rows


def split_name(row: dict, server_gpus: int = 0) -> str:
    """'7 target + 1 drafter' (target devices), or with vLLM servers of `server_gpus` devices each
    '2 vLLM server(s) x 2 device(s) + 4 drafter'."""
    if server_gpus:
        return f"{row['targets']} vLLM server(s) x {server_gpus} device(s) + {row['drafters']} drafter"
    return f"{row['targets']} target + {row['drafters']} drafter"


def anchor_headroom(row: dict) -> float:
    """How many times the draft rows per target token a target-bound split's drafters could train
    in the same time (the drafters' demand over the targets' supply); 1.0 when the drafters bound it."""
    if row["bound"] != "target" or row["drafter_rows_per_s"] <= 0:
        return 1.0
    return row["demand_rows_per_s"] / row["drafter_rows_per_s"]


def headroom_line(row: dict, max_anchors: int, peak_gib: float, serve: bool, server_gpus: int = 0) -> str | None:
    """The advice line for a split whose drafters would wait on the targets; None when they would
    not (within a few percent, about the spread of the planner's own measurement)."""
    headroom = anchor_headroom(row)
    if headroom < 1.05:
        return None
    return (f"plan: at {split_name(row, server_gpus)} the targets are the bound: the drafters "
            f"could train {headroom:.1f}x the draft rows per target token in the same time (--max-anchors "
            f"{max_anchors} -> about {int(max_anchors * headroom)}, where the sequences have room for them; the "
            f"drafter's peak, {peak_gib:.1f} GiB now, grows with its rows; --plan again with it re-chooses the split)"
            + ("; that is the idle time --drafter-serves-target fills instead: take one or the other" if serve else ""))


def measure(args, facts: StartFacts) -> dict:
    """A warm-up and --plan-steps training steps of one drafter rank in this process, fed by one
    target replica or, with servers, by the first vLLM server: Rt, Rd, rows_per_token, the peak."""
    a = args.replace(resume="never", max_steps=args.plan_steps + 1, eval_num_prompts=0)
    one = dataclasses.replace(facts, target_devices=facts.target_devices[:1], drafter_devices=facts.drafter_devices[:1],
                              servers=facts.servers[:1])
    if facts.servers:
        # One micro-batch in flight: the feed's target_s (its slowest request, all sent at once) then
        # adds up to the seconds the server was busy; deeper, the micro-batches overlap at the server
        # and the same seconds would count twice.
        a = a.replace(target_servers=facts.servers[0].url, queue_depth=1)
    trainer = Trainer(a, one, Status.null(), log=lambda s: None, rank=Rank())
    trainer.setup()
    assert isinstance(trainer.feed, VllmFeed if facts.servers else InProcessFeed)
    kind = trainer.dcfg.drafter_kind  # the run's own drafter: DFlash 2's steps carry its selector loss
    try:
        recs = [trainer.train_step() for _ in range(a.max_steps)][1:]  # the first step warms up (and compiles)
    finally:
        trainer.feed.close()  # a server's answers asked for ahead are read and removed too
    assert kind == args.drafter_kind and all(("selector_loss" in r) == (kind == "dflash2") for r in recs)
    tokens = sum(r["target_tokens"] for r in recs)
    rows = sum(r["rows"] for r in recs)
    return {"steps": len(recs), "tokens": tokens, "rows": rows,
            "rt": tokens / max(sum(r["target_s"] for r in recs), 1e-9),
            "rd": rows / max(sum(r["drafter_s"] for r in recs), 1e-9),
            "rpt": rows / max(tokens, 1), "peak_gib": max(r["peak_mem_bytes"] for r in recs) / 2**30,
            "target": f"vLLM server {facts.servers[0].url}" if facts.servers else one.target_devices[0],
            "drafter": one.drafter_devices[0], "kind": kind}


# What one measured drafter step holds, per kind (docs/trainer.md, "--plan").
KIND_STEP = {"dflash": "DFlash: forward, loss, backward, AdamW",
             "dflash2": "DFlash 2: its convolutions, candidate selector and selector loss included"}


def device_flags(devs: list[str], k: int) -> str:
    """The first k of the node's devices as targets, the rest as drafters."""
    ids = ["cpu"] * len(devs) if devs[0] == "cpu" else [d.split(":")[1] for d in devs]
    return f"--target-gpus {','.join(ids[:k])} --drafter-gpus {','.join(ids[k:])}"


def server_flags(facts: StartFacts, row: dict, server_gpus: int) -> str:
    """A split of best_split's with servers, as the inventory's `vllm.servers` and the trainer's flags
    take it. The trainer never sees the servers' GPUs: they are taken to be the lowest ids that
    --drafter-gpus does not list."""
    k = row["targets"]
    counts = (f"{k} `vllm.servers` entr{'y' if k == 1 else 'ies'} (--target-servers with {k} URL(s), "
              f"--server-gpus {server_gpus})")
    if facts.drafter_devices[0] == "cpu":
        return f"{counts}; --drafter-gpus {','.join(['cpu'] * row['drafters'])}"
    listed = [int(d.split(":")[1]) for d in facts.drafter_devices]
    n_servers = len(facts.servers) * server_gpus
    node = sorted(listed + [i for i in range(n_servers + len(listed)) if i not in listed][:n_servers])
    cut = k * server_gpus
    gpus = ", ".join(f'gpus "{",".join(map(str, node[i:i + server_gpus]))}"' for i in range(0, cut, server_gpus))
    return f"{counts}: {gpus}; --drafter-gpus {','.join(map(str, node[cut:]))}"


def run_plan(args, facts: StartFacts, log) -> int:
    """Measure one target (or one vLLM server) and one drafter in this process, log the table and
    the best split. Writes nothing."""
    facts = without_quarantined(facts, args.output_dir, log)
    m = measure(args, facts)
    rt, rd, rpt, peak = m["rt"], m["rd"], m["rpt"], m["peak_gib"]
    sg = args.server_gpus if facts.servers else 0
    per = f" (one micro-batch in flight; --server-gpus {sg})" if sg else ""
    log(f"plan: measured {m['steps']} step(s) after a warm-up; target on {m['target']}: {rt:,.0f} tokens/s{per}; "
        f"drafter on {m['drafter']}: {rd:,.0f} rows/s ({KIND_STEP[m['kind']]}; peak {peak:.1f} GiB); "
        f"{rpt:.3f} draft rows per target token ({m['rows'] / m['steps']:,.0f} rows, "
        f"{m['tokens'] / m['steps']:,.0f} tokens per step)")
    if sg:  # the node: the servers' GPUs and the drafters'
        n = len(facts.servers) * sg + len(facts.drafter_devices)
        table = best_split(n, rt, rd, rpt, per_target=sg, serving=False)
    else:
        devs = node_devices(facts)
        n = len(devs)
        if n < 2:
            both = 1 / (1 / max(rt * rpt, 1e-9) + 1 / max(rd, 1e-9))
            log(f"plan: one device ({devs[0]}): target and drafter take turns on it: about {both:,.0f} drafter "
                "rows/s; list more devices in --target-gpus/--drafter-gpus to plan a split")
            return 0
        table = best_split(n, rt, rd, rpt)
    for row in table:
        serving = (f"; {row['serving_rows_per_s']:,.0f} with --drafter-serves-target"
                   if row["serving_rows_per_s"] > row["drafter_rows_per_s"] else "")
        log(f"plan:   {split_name(row, sg)}: {row['drafter_rows_per_s']:,.0f} "
            f"drafter rows/s ({row['bound']}-bound){serving}")
    best = max(table, key=lambda r: r["serving_rows_per_s"])
    k, serve = best["targets"], best["serving_rows_per_s"] > best["drafter_rows_per_s"]
    flags = server_flags(facts, best, sg) if sg else device_flags(devs, k)
    if serve:
        flags += " --drafter-serves-target"
    bound = "the drafters serving too" if serve else f"{best['bound']}-bound"
    log(f"plan: best split of {n} device(s): {split_name(best, sg)}, about "
        f"{best['serving_rows_per_s']:,.0f} drafter rows/s ({bound}): {flags}")
    line = headroom_line(best, args.max_anchors, peak, serve, sg)
    if line:
        log(line)
    if serve:
        log(f"plan: with --drafter-serves-target each drafter device also holds a target replica: it needs room "
            f"for one beside the drafter's peak of {peak:.1f} GiB")
    return 0

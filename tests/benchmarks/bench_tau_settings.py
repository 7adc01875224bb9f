"""tau of drafters trained for the same budget with different loss settings, on a tiny target.

    python tests/benchmarks/bench_tau_settings.py --jobs 8 --threads-per-job 2     # 16 cores, ~10 min
    python tests/benchmarks/bench_tau_settings.py --quick                          # 2 cores, a few min
    python tests/benchmarks/bench_tau_settings.py --settings LABELS --seeds 0,1,2 --out DIR [--vllm]

--target text (default) is `dflash-tiny-text`'s target (Python stdlib source, bytes; 2 decoder
layers, so the drafter reads layers 0,1: the trainer's default needs 4); --target hybrid is
`dflash-tiny --arch qwen3_5`'s (the Qwen3.5/3.6 layout, phrase language); --target text-hybrid
the real-text target on that layout (4 layers). Each is built once and
cached by platform/tiny-assets.sh (or --assets DIR). Every trained setting gets the same optimizer
steps, micro-batch and drafter, for each seed; the untrained drafter (dflash-eval --random-drafter,
one layer, same seed) is the floor. Each trained drafter is exported (dflash-export: bf16, what a
user serves) and that export is evaluated by dflash-eval on the held-out prompts greedy and at
temperature 1 (speculative sampling), its drafts sampled (z-lab's protocol) and greedy (vLLM's
default); with --vllm also by vLLM itself (its CPU build's venv,
tests/benchmarks/vllm_judge.py: one engine start a draft method, JUDGED), whose figure is pooled
(1 + accepted / drafts). The runs are subprocesses, --jobs at a time, each limited to
--threads-per-job torch threads (vLLM's, one at a time). An --out folder that already holds a
run's export or figure keeps it: a second invocation with the same --out does only what is
missing (train on a large machine, then judge with vLLM where its venv is). Prints every run's
wall time, then one table: per setting the median over seeds and the spread (min-max) of
tau_prompt_mean (the mean of per-prompt tau, the published figure) and tau_pooled (all committed
tokens / all cycles), greedy and at T=1, and vLLM's. --json writes every figure.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# name -> dflash-train flags on top of the common ones (None: the untrained drafter). Each names its CE
# label (the default changed once: every figure keeps its meaning); CE uses the trainer's default
# weighting (streak); the KL settings differ from each other only in T.
SETTINGS = {
    "untrained": None,
    "ce-streak": ["--ce-target", "data"],  # CE on the data's token
    "ce-argmax-streak": ["--ce-target", "target-argmax"],  # CE on the target's most likely token
    "ce-decay": ["--ce-target", "data", "--loss-weighting", "decay"],
    "kl-T1-w0.7-streak": ["--ce-target", "data", "--use-soft-labels", "--kl-temperature", "1", "--kl-weight", "0.7"],
    "kl-T1-w0.7-argmax-streak": ["--use-soft-labels", "--kl-temperature", "1", "--kl-weight", "0.7",
                                 "--ce-target", "target-argmax"],
    "kl-argmax-streak": ["--use-soft-labels", "--ce-target", "target-argmax"],  # the KL's own defaults (T 1, w 0.5)
    "kl-T2-w0.7-streak": ["--ce-target", "data", "--use-soft-labels", "--kl-temperature", "2",
                          "--kl-weight", "0.7"],  # the incident's
    # DFlash 2 (grouped dynamic convolutions and the candidate selector, speculators' defaults), same budget
    "dflash2": ["--drafter-kind", "dflash2", "--ce-target", "data"],
    "dflash2-argmax": ["--drafter-kind", "dflash2", "--ce-target", "target-argmax"],
    # the same with the fused loss's FP8 teacher GEMM: does it cost tau? (a CUDA drafter only)
    "kl-T2-w0.7-streak-fp8": ["--ce-target", "data", "--use-soft-labels", "--kl-temperature", "2", "--kl-weight",
                              "0.7", "--teacher-fp8"],
}
GPU_ONLY = {"kl-T2-w0.7-streak-fp8"}
# vLLM 0.32.0's CPU build loads a DFlash 2 drafter but refuses to start it (docs/export.md): dflash-eval only
NOT_SERVED_ON_CPU = {"dflash2", "dflash2-argmax"}
# --settings GROUP: LABELS, the CE label's settings, each with and without soft labels; DFLASH2, DFlash
# against DFlash 2 with either label
GROUPS = {"LABELS": ["untrained", "ce-streak", "ce-argmax-streak", "kl-T1-w0.7-streak", "kl-T1-w0.7-argmax-streak"],
          "DFLASH2": ["ce-streak", "dflash2", "ce-argmax-streak", "dflash2-argmax"]}
# the 2-layer text target: the trainer's default target layers need 4 layers, so both of its layers;
# the hybrid ones (4 layers) take the trainer's default
TARGET_LAYERS = {"text": "0,1", "hybrid": None, "text-hybrid": None}
# vLLM's judge: (temperature, draft_sample_method), one engine start a method (vLLM fixes it per engine):
# greedy, T=1 with vLLM's default greedy drafts, T=1 with drafts sampled from the drafter (z-lab's protocol)
JUDGED = ((0.0, "greedy"), (1.0, "greedy"), (1.0, "probabilistic"))
JUDGED_NAMES = {(0.0, "greedy"): "vLLM greedy", (1.0, "greedy"): "vLLM T=1", (1.0, "probabilistic"):
                "vLLM T=1 sampled drafts"}
# dflash-eval's measures: (temperature, draft_sample_method); at T=1 both protocols, the greedy-drafts
# one being what vLLM serves by default (docs/trainer.md, "Sampled tau, two protocols")
EVALS = ((0.0, "probabilistic"), (1.0, "probabilistic"), (1.0, "greedy"))
FULL = dict(steps=250, seeds="0,1", num_prompts=32, max_new_tokens=64, jobs=8, threads=2, token_budget=2048,
            max_anchors=256)
# on the shared 2-core machine at load 7-8: 718 s (30 steps, 8 prompts x 32 tokens took 1,060 s)
QUICK = dict(steps=15, seeds="0,1", num_prompts=4, max_new_tokens=24, jobs=2, threads=1, token_budget=1024,
             max_anchors=128)
VLLM_PYTHON = Path(os.environ.get("FLASHFLEET_VLLM_PYTHON", ROOT / ".cache" / "vllm-venv" / "bin" / "python"))


def tool(name):
    exe = BIN / name
    return [str(exe)] if exe.exists() else [sys.executable, "-m", {"dflash-train": "flashfleet_trainer.cli",
                                                                  "dflash-eval": "flashfleet_trainer.evaluate",
                                                                  "dflash-export": "flashfleet_trainer.export"}[name]]


def env(threads, extra=None):
    e = {**os.environ, **(extra or {})}
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        e[k] = str(threads)
    return e


def run(cmd, log, threads, extra_env=None):
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env(threads, extra_env)).returncode
    dt = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{cmd[0]} exited {rc}; see {log}")
    return dt


def train_job(a, assets, name, seed, out):
    """Train one drafter and export it (run_dir/export); an export already there is kept."""
    run_dir = out / f"{name}-s{seed}"
    if (run_dir / "export" / "config.json").exists():
        return json.loads((run_dir / "wall.json").read_text())["train_s"]
    layers = ["--target-layers", a.target_layers] if a.target_layers else []
    if a.target in ("hybrid", "text-hybrid") and a.device == "cuda":  # the tiny hybrid's Gated-DeltaNet layers: torch's path is fine
        layers.append("--allow-slow-linear-attention")
    cmd = [*tool("dflash-train"), "--target-model", str(assets / "model"), "--data-dir", str(assets / "data"),
           "--output-dir", str(run_dir), "--target-gpus", a.gpu, "--drafter-gpus", a.gpu,
           "--block-size", str(a.block_size), "--num-draft-layers", str(a.num_draft_layers), *layers,
           "--max-steps", str(a.steps), "--token-budget", str(a.token_budget), "--max-seq-len", "256",
           "--max-batch-size", "64", "--max-anchors", str(a.max_anchors), "--lr", str(a.lr),
           "--warmup-ratio", "0.05", "--seed", str(seed), "--resume", "never", "--save-interval", str(a.steps),
           "--eval-num-prompts", "0", "--eval-interval", "0", "--log-interval", str(max(1, a.steps // 10)),
           *SETTINGS[name]]
    run_dir.mkdir(parents=True, exist_ok=True)
    dt = run(cmd, run_dir / "train.log", a.threads_per_job)
    run([*tool("dflash-export"), str(run_dir), str(run_dir / "export"), "--force"], run_dir / "export.log", 1)
    (run_dir / "wall.json").write_text(json.dumps({"train_s": dt}) + "\n")
    print(f"  trained {name} seed {seed}: {a.steps} steps in {dt:.1f} s", flush=True)
    return dt


def prompts_file(a, assets, out) -> Path:
    """The first --num-prompts held-out prompts as a JSON list of token id lists (vllm_serve_check's input)."""
    path = out / f"prompts-{a.num_prompts}.json"
    rows = [json.loads(line)["input_ids"] for line in (assets / "data" / "eval" / "prompts.jsonl").read_text().splitlines()]
    path.write_text(json.dumps(rows[:a.num_prompts]) + "\n")
    return path


def eval_job(a, assets, name, seed, temperature, draft, out):
    """dflash-eval's figures for one drafter (the export, or the untrained one) at one temperature,
    its drafts drawn by `draft` (probabilistic or greedy) when sampling."""
    run_dir = out / f"{name}-s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    tag = f"T{temperature:g}" + ("-greedy-drafts" if draft == "greedy" else "")
    saved = run_dir / f"eval-{tag}.json"
    if saved.exists():
        return json.loads(saved.read_text())
    drafter = (["--random-drafter", "--block-size", str(a.block_size), "--num-draft-layers", "1"]
               if SETTINGS[name] is None else ["--drafter", str(run_dir / "export")])
    cmd = [*tool("dflash-eval"), "--target-model", str(assets / "model"), *drafter, "--seed", str(seed),
           "--prompts", str(assets / "data" / "eval" / "prompts.jsonl"), "--num-prompts", str(a.num_prompts),
           "--max-new-tokens", str(a.max_new_tokens), "--temperature", str(temperature),
           "--draft-sample-method", draft, "--device", a.device]
    log = run_dir / f"eval-{tag}.log"
    dt = run(cmd, log, a.threads_per_job)
    res = json.loads(log.read_text().strip().splitlines()[-1])
    saved.write_text(json.dumps(res) + "\n")
    print(f"  evaluated {name} seed {seed} {tag}: tau_prompt_mean {res['tau_prompt_mean']:.3f}, "
          f"tau_pooled {res['tau_pooled']:.3f} ({dt:.1f} s)", flush=True)
    return res


def vllm_judge(assets, drafter, run_dir, prompts, max_new_tokens, threads, label):
    """vLLM's own figures for one drafter (tests/benchmarks/vllm_judge.py) at each of JUDGED, one
    engine start a draft method, saved in run_dir (vllm.json, vllm-probabilistic.json) and kept
    there: {(temperature, draft method): result}."""
    res = {}
    for method in dict.fromkeys(m for _, m in JUDGED):
        saved = run_dir / ("vllm.json" if method == "greedy" else f"vllm-{method}.json")
        temps = [t for t, m in JUDGED if m == method]
        if not saved.exists():
            cmd = [str(VLLM_PYTHON), str(ROOT / "tests" / "benchmarks" / "vllm_judge.py"), str(assets / "model"),
                   str(prompts), str(saved), str(drafter), "--max-new-tokens", str(max_new_tokens),
                   "--temperatures", ",".join(f"{t:g}" for t in temps), "--draft-sample-method", method]
            env = {"PYTHONPATH": str(ROOT / "trainer"), "VLLM_CPU_KVCACHE_SPACE": "1"}
            dt = run(cmd, saved.with_suffix(".log"), threads, env)
            got = ", ".join(f"T={r['temperature']:g} {r['tau']:.3f}" for r in json.loads(saved.read_text())["results"])
            print(f"  vLLM served {label} ({method} drafts): tau {got} ({dt:.0f} s)", flush=True)
        # a figure saved before the method was recorded was vLLM's default, greedy drafts
        res |= {(r["temperature"], r.get("draft_sample_method", "greedy")): r
                for r in json.loads(saved.read_text())["results"] if r["temperature"] in temps}
    return res


def vllm_job(a, assets, name, seed, out, prompts):
    """vllm_judge for one setting's exported drafter."""
    run_dir = out / f"{name}-s{seed}"
    return vllm_judge(assets, run_dir / "export", run_dir, prompts, a.max_new_tokens, a.threads_per_job,
                      f"{name} seed {seed}")


def cell(values):
    med = statistics.median(values)
    return f"{med:.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"a check that it works end to end on 2 cores: {QUICK}")
    p.add_argument("--target", choices=sorted(TARGET_LAYERS), default="text", help="text: dflash-tiny-text's; "
                   "hybrid: dflash-tiny --arch qwen3_5's; text-hybrid: dflash-tiny-text --arch qwen3_5's "
                   "(default text)")
    p.add_argument("--assets", type=Path, default=None, help="a dflash-tiny-text or dflash-tiny output (default: "
                   "built or reused by platform/tiny-assets.sh 0 TARGET)")
    p.add_argument("--target-layers", default=None, help="the drafter's target layers (default: 0,1 for the "
                   "2-layer text target, the trainer's default for the hybrid one)")
    p.add_argument("--out", type=Path, default=None, help="where the runs go (default: a new temporary folder); "
                   "what an earlier invocation left there is reused")
    p.add_argument("--jobs", type=int, default=None, help=f"runs at a time (default {FULL['jobs']})")
    p.add_argument("--threads-per-job", type=int, default=None, help=f"torch threads per run (default {FULL['threads']})")
    p.add_argument("--steps", type=int, default=None, help=f"optimizer steps per training (default {FULL['steps']})")
    p.add_argument("--seeds", default=None, help=f"comma-separated (default {FULL['seeds']})")
    p.add_argument("--num-prompts", type=int, default=None, help=f"held-out prompts (default {FULL['num_prompts']})")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"per prompt (default {FULL['max_new_tokens']})")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--num-draft-layers", type=int, default=2)
    p.add_argument("--token-budget", type=int, default=None, help="tokens per micro-batch (default "
                   f"{FULL['token_budget']}: 21 sequences of 96)")
    p.add_argument("--max-anchors", type=int, default=None, help=f"draft blocks per micro-batch (default {FULL['max_anchors']})")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--settings", default=None, help="comma-separated subset of " + ", ".join(SETTINGS) +
                   ", or " + ", ".join(GROUPS) + " (" + "; ".join(f"{k}: {', '.join(v)}" for k, v in GROUPS.items())
                   + "); default: all that run on --device (" + ", ".join(sorted(GPU_ONLY)) + " only with --device cuda)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: every run on GPU 0")
    p.add_argument("--vllm", action="store_true", help="also judge each trained drafter with vLLM itself (its CPU "
                   f"build's venv: $FLASHFLEET_VLLM_PYTHON, default {VLLM_PYTHON.relative_to(ROOT)})")
    p.add_argument("--no-train", action="store_true", help="judge only what --out already holds: a run without an "
                   "export is an error")
    p.add_argument("--json", type=Path, default=None, help="also write every figure here")
    a = p.parse_args(argv)
    base = QUICK if a.quick else FULL
    a.steps = a.steps or base["steps"]
    a.jobs = a.jobs or base["jobs"]
    a.threads_per_job = a.threads_per_job or base["threads"]
    a.num_prompts = a.num_prompts or base["num_prompts"]
    a.max_new_tokens = a.max_new_tokens or base["max_new_tokens"]
    a.token_budget = a.token_budget or base["token_budget"]
    a.max_anchors = a.max_anchors or base["max_anchors"]
    a.target_layers = a.target_layers or TARGET_LAYERS[a.target]
    seeds = [int(s) for s in (a.seeds or base["seeds"]).split(",")]
    names = ([n for part in a.settings.split(",") for n in GROUPS.get(part, [part])] if a.settings
             else [n for n in SETTINGS if a.device == "cuda" or n not in GPU_ONLY])
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        p.error(f"unknown setting(s) {', '.join(unknown)}: choose from {', '.join(SETTINGS)}")
    if a.device == "cpu" and GPU_ONLY & set(names):
        p.error(f"{', '.join(sorted(GPU_ONLY & set(names)))} needs a CUDA drafter: add --device cuda")
    if a.vllm and not VLLM_PYTHON.exists():
        p.error(f"--vllm: no vLLM venv at {VLLM_PYTHON}: make vllm-venv, or set FLASHFLEET_VLLM_PYTHON")
    if a.no_train and a.out is None:
        p.error("--no-train judges an earlier --out: name it")
    a.gpu = "0" if a.device == "cuda" else "cpu"
    if a.assets is None:
        a.assets = Path(subprocess.run(["bash", str(ROOT / "platform" / "tiny-assets.sh"), "0", a.target], check=True,
                                       stdout=subprocess.PIPE, text=True,
                                       env={**os.environ, "PYTHON": sys.executable}).stdout.strip())
    out = a.out or Path(tempfile.mkdtemp(prefix="bench-tau-"))
    out.mkdir(parents=True, exist_ok=True)
    trained = [n for n in names if SETTINGS[n] is not None]
    if a.no_train:
        missing = [f"{n}-s{s}" for n in trained for s in seeds if not (out / f"{n}-s{s}" / "export").is_dir()]
        if missing:
            p.error(f"--no-train: no export in {out} for {', '.join(missing)}: train them first (drop --no-train)")
    print(f"target {a.assets} ({a.target}, target layers {a.target_layers or 'default'}); runs in {out}; "
          f"{len(names)} settings x seeds {seeds}; {a.steps} steps, block {a.block_size}, {a.num_draft_layers} draft "
          f"layers, token budget {a.token_budget}, {a.max_anchors} anchors; {a.jobs} jobs x {a.threads_per_job} "
          f"threads on {a.device}", flush=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.jobs) as pool:
        trains = {(n, s): pool.submit(train_job, a, a.assets, n, s, out) for n in trained for s in seeds}
        wall = {k: f.result() for k, f in trains.items()}
        evals = {(n, s, t, d): pool.submit(eval_job, a, a.assets, n, s, t, d, out)
                 for n in names for s in seeds for t, d in EVALS}
        res = {k: f.result() for k, f in evals.items()}
    served = {}
    if a.vllm:  # after the pool: the engine uses every thread it is given
        prompts = prompts_file(a, a.assets, out)
        served = {(n, s, *j): r for n in trained if n not in NOT_SERVED_ON_CPU for s in seeds
                  for j, r in vllm_job(a, a.assets, n, s, out, prompts).items()}
    cols = [("greedy", EVALS[0], "tau_prompt_mean"), ("greedy", EVALS[0], "tau_pooled"),
            ("T=1", EVALS[1], "tau_prompt_mean"), ("T=1", EVALS[1], "tau_pooled"),
            ("T=1 greedy drafts", EVALS[2], "tau_pooled")]
    header = ["setting"] + [f"{m} {k}" for m, _, k in cols] + ([JUDGED_NAMES[j] for j in JUDGED] if a.vllm else [])
    header.append("train wall s")
    rows = []
    for n in names:
        row = [n] + [cell([res[(n, s, *e)][k] for s in seeds]) for _, e, k in cols]
        if a.vllm:
            row += [cell([served[(n, s, *j)]["tau"] for s in seeds]) if (n, seeds[0], *j) in served else "-"
                    for j in JUDGED]
        row.append(cell([wall[(n, s)] for s in seeds]) if SETTINGS[n] is not None else "-")
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\ntau on {a.num_prompts} held-out prompts x {a.max_new_tokens} new tokens, block {a.block_size} "
          f"(ceiling {a.block_size}); median (min-max) over seeds {seeds}; {time.perf_counter() - t0:.0f} s in all")
    for r in [header, ["-" * w for w in widths], *rows]:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    if a.json:
        a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "wall_s": {
            f"{n}-s{s}": v for (n, s), v in wall.items()}, "results": {
            f"{n}-s{s}-T{t:g}-{d}": r for (n, s, t, d), r in res.items()}, "vllm": {
            f"{n}-s{s}-T{t:g}-{d}": {k: v for k, v in r.items() if k != "outputs"}
            for (n, s, t, d), r in served.items()}},
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

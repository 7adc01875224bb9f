"""flashfleet against vLLM's `speculators` 0.9.0 DFlash trainer: the same tokens and steps, judged by vLLM.

    .venv/bin/python -m pip install --target .cache/speculators-0.9.0 --no-deps speculators==0.9.0 \
        hs-connectors==0.9.0 loguru==0.7.3
    .venv/bin/python -m pip install --target .cache/speculators-0.9.0 openai "datasets<=5.1.0,>=4.0.0" \
        pydantic-settings typer rich
    .venv/bin/python tests/benchmarks/bench_vs_speculators.py --out .cache/bench/vs-speculators --seeds 0,1 \
        --flashfleet-out .cache/bench/tau-text

The peer is installed into a directory of its own (--speculators, default .cache/speculators-0.9.0) and
runs in a subprocess with that directory first on its path; nothing of it is imported here or
shipped. Both trainers get the real-text tiny target (`platform/tiny-assets.sh 0 text`), its 384
training rows, 250 optimizer steps (--steps), block 8, 2 draft layers, the target's two layers as
features (flashfleet's 0,1 = speculators' ids 1,2: it counts hidden states, 0 being the
embeddings), 256 anchors and 2,048 tokens per step, lr 1e-3; every other setting is each
trainer's default. speculators reads its training data as a user's offline run would: an Arrow
data set (`input_ids`, `loss_mask`, `seq_len`) and one `hs_<i>.safetensors` per row holding the
target's states at those ids and its last layer (before the final norm) and the tokens, which its
vLLM extraction would have written; here transformers computes them from the same target in fp32.

Two patches make speculators' trainer run on a CPU, applied in its subprocess only (`cpu_patches`):
its single-process trainer moves the model and batches to `get_local_rank()`, device index 0,
which means CUDA (the patch returns "cpu"), and it calls `torch.accelerator.synchronize()`, which
fails without an accelerator (the patch skips it when there is none).

Each speculators drafter is judged as its trainer saves it (the checkpoint directory, speculators'
config layout, which vLLM loads) by vLLM itself on the first --num-prompts held-out prompts, greedy
and at T=1 with greedy drafts (vLLM's default) and with drafts sampled from the drafter
(`draft_sample_method: probabilistic`) (bench_tau_settings.vllm_judge, vLLM's CPU build). flashfleet's side is
bench_tau_settings.py run with the same budget (--flashfleet-settings; its --out is
--flashfleet-out, reused when it already holds the runs). Prints one table.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.benchmarks import bench_tau_settings as taus  # noqa: E402

MASK_ROW = 257  # the text target's spare row (flashfleet's default mask id for it: vocab_size - 1)
# speculators' batches per epoch here: its default 90% of the 384 rows (the rest validates) packed into
# 2,048-token batches (its progress bar: "x/17"). Its max_steps stops an epoch, but every later epoch
# still runs one step, so the epochs are set to end where the steps do.
SPECULATORS_BATCHES_PER_EPOCH = 17


# ---- the speculators side (its own subprocess, --speculators first on sys.path) --------------------

def cpu_patches():
    """The two changes that let speculators 0.9.0's trainer run on a CPU, in this process only."""
    import torch
    from speculators.train import trainer as spec_trainer

    spec_trainer.get_local_rank = lambda: "cpu"  # it moves model and batches to device index 0 (CUDA)
    sync = torch.accelerator.synchronize
    torch.accelerator.synchronize = lambda *a, **k: (sync(*a, **k) if torch.accelerator.is_available() else None)


def write_data(assets: Path, out: Path, layer_ids: list[int]):
    """flashfleet's training rows as speculators' offline data: the Arrow set and the hidden states."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    if (out / "dataset_info.json").exists():
        return
    table = pq.read_table(assets / "data" / "train-00000.parquet").to_pydict()
    rows, masks = table["input_ids"], table["loss_mask"]
    model = AutoModelForCausalLM.from_pretrained(assets / "model", dtype=torch.float32).eval()
    outputs = {}
    hooks = [layer.register_forward_hook(lambda m, i, o, k=k: outputs.__setitem__(k, o[0] if isinstance(o, tuple) else o))
             for k, layer in enumerate(model.model.layers)]
    (out / "hidden_states").mkdir(parents=True, exist_ok=True)
    n = len(model.model.layers)
    with torch.no_grad():
        for i, ids in enumerate(rows):
            x = torch.tensor(ids, dtype=torch.long)[None]
            model.model(x)
            # hidden-state id j (j >= 1) is decoder layer j-1's output, before any final norm
            states = [outputs[j - 1][0] for j in layer_ids] + [outputs[n - 1][0]]
            save_file({"hidden_states": torch.stack(states, dim=1).contiguous(), "token_ids": x[0].clone()},
                      out / "hidden_states" / f"hs_{i}.safetensors")
    for h in hooks:
        h.remove()
    # from an Arrow table: Dataset.from_dict's fingerprint pickles pyarrow's types, which fails here
    ds = datasets.Dataset(pa.table({"input_ids": pa.array(rows, pa.list_(pa.int64())),
                                    "loss_mask": pa.array(masks, pa.list_(pa.int64())),
                                    "seq_len": pa.array([len(r) for r in rows], pa.int64())}), fingerprint="tiny-text")
    ds.set_format(type="torch")
    ds.save_to_disk(str(out))


def speculators_side(a):
    cpu_patches()
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    layer_ids = [i + 1 for i in a.layers]
    data = a.out / "speculators-data"
    write_data(a.assets, data, layer_ids)
    argv = ["--speculator-type", "dflash", "--verifier-name-or-path", str(a.assets / "model"),
            "--data-path", str(data), "--save-path", str(a.save), "--num-layers", "2", "--block-size", "8",
            "--target-layer-ids", *map(str, layer_ids), "--mask-token-id", str(MASK_ROW),
            "--max-anchors", "256", "--total-seq-len", "2048", "--lr", "1e-3", "--max-steps", str(a.steps),
            "--epochs", str(-(-a.steps // SPECULATORS_BATCHES_PER_EPOCH)),
            "--seed", str(a.seed), "--on-missing", "raise", "--num-workers", "1", "--log-dir", str(a.save / "logs"),
            # on a CPU: its bf16 default autocasts for "cuda" only, torch has no flex attention backward on
            # CPU, and its fused loss is a Triton (GPU) kernel; the eager loss is the same definition
            "--hidden-states-dtype", "float32", "--draft-attn-impl", "sdpa", "--loss-implementation", "eager"]
    main(TrainConfig.resolve(argv))


# ---- the orchestration (the project's venv) ---------------------------------------------------------

def saved_checkpoint(save: Path) -> Path | None:
    """The last epoch's checkpoint speculators wrote under `save` (SAVE/<epoch>/config.json)."""
    found = sorted((p.parent for p in save.glob("*/config.json") if p.parent.name.isdigit()),
                   key=lambda p: int(p.name))
    return found[-1] if found else None


def cell(values):
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="where the runs go (reused when it holds them)")
    p.add_argument("--assets", type=Path, default=None, help="a dflash-tiny-text output (default: "
                   "platform/tiny-assets.sh 0 text)")
    p.add_argument("--speculators", type=Path, default=ROOT / ".cache" / "speculators-0.9.0",
                   help="the directory speculators 0.9.0 is installed in (pip install --target)")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--num-prompts", type=int, default=48)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--flashfleet-out", type=Path, default=None, help="bench_tau_settings.py's --out for "
                   "flashfleet's runs (default: OUT/flashfleet)")
    p.add_argument("--flashfleet-settings", default="ce-streak,ce-argmax-streak", help="bench_tau_settings "
                   "settings; none: speculators' figures only")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each process")
    p.add_argument("--speculators-side", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--save", type=Path, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.layers, a.threads_per_job = [0, 1], a.threads
    if a.assets is None:
        a.assets = Path(subprocess.run(["bash", str(ROOT / "platform" / "tiny-assets.sh"), "0", "text"], check=True,
                                       stdout=subprocess.PIPE, text=True).stdout.strip())
    if a.speculators_side:
        speculators_side(a)
        return 0
    if not (a.speculators / "speculators").is_dir():
        p.error(f"--speculators {a.speculators}: no speculators package there: install it (see --help's first lines)")
    seeds = [int(s) for s in a.seeds.split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    ff_out = a.flashfleet_out or a.out / "flashfleet"
    names = [] if a.flashfleet_settings == "none" else a.flashfleet_settings.split(",")
    if names:
        taus.main(["--assets", str(a.assets), "--settings", a.flashfleet_settings, "--seeds", a.seeds, "--steps",
                   str(a.steps), "--num-prompts", str(a.num_prompts), "--max-new-tokens", str(a.max_new_tokens),
                   "--jobs", "1", "--threads-per-job", str(a.threads), "--out", str(ff_out), "--vllm"])
    prompts = taus.prompts_file(a, a.assets, a.out)
    spec = {}
    for seed in seeds:
        save = a.out / f"speculators-s{seed}"
        if saved_checkpoint(save) is None:
            env = {**taus.env(a.threads), "PYTHONPATH": os.pathsep.join([str(a.speculators), str(ROOT)])}
            with open(a.out / f"speculators-s{seed}.log", "w") as log:
                rc = subprocess.run([sys.executable, __file__, "--speculators-side", "--out", str(a.out), "--assets",
                                     str(a.assets), "--seed", str(seed), "--steps", str(a.steps), "--save", str(save)],
                                    env=env, stdout=log, stderr=subprocess.STDOUT).returncode
            if rc != 0 or saved_checkpoint(save) is None:
                raise RuntimeError(f"speculators' training exited {rc}; see {a.out}/speculators-s{seed}.log")
            steps = json.loads((saved_checkpoint(save) / "training_state.json").read_text())["global_step"]
            if steps != a.steps:
                raise RuntimeError(f"speculators took {steps} optimizer steps, not {a.steps}: its batches per "
                                   f"epoch are not {SPECULATORS_BATCHES_PER_EPOCH} (see its log)")
        spec[seed] = taus.vllm_judge(a.assets, saved_checkpoint(save), save, prompts, a.max_new_tokens, a.threads,
                                     f"speculators seed {seed}")
    print(f"\nvLLM's tau on {a.num_prompts} held-out prompts x {a.max_new_tokens} tokens, block 8; median (min-max) "
          f"over seeds {seeds}; {a.steps} steps each")
    print(" | ".join(["trainer", *(taus.JUDGED_NAMES[j] for j in taus.JUDGED)]))
    print(" | ".join(["speculators 0.9.0 DFlash (its defaults)", *(cell([spec[s][j]["tau"] for s in seeds])
                                                                  for j in taus.JUDGED)]))
    for name in names:
        got = [taus.vllm_job(a, a.assets, name, s, ff_out, prompts) for s in seeds]
        print(" | ".join([f"flashfleet {name}", *(cell([g[j]["tau"] for g in got]) for j in taus.JUDGED)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

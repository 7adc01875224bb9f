"""Target features through a vLLM server against the in-process target, measured in one call.

    python -m tests.benchmarks.bench_vllm_target --tiny .cache/tiny-<hash> [--batches 16] [--repeats 3]

Starts one vLLM server (vLLM's CPU build, .cache/vllm-venv: `make vllm-venv`) on the tiny target,
then feeds the same micro-batches through feed.InProcessFeed (the anchor: the target in the
trainer's process) and vllm_target.VllmFeed (queue depth 2, soft labels: the final state too),
`--repeats` times each, and prints tokens/s for both (median, min, max), their ratio, and the
hand-over's cost: bytes of hidden states per token and the seconds per GiB of reading and
removing the files (read_hidden). On a 2-core CPU both sides share the cores with the server, so
the ratio says what the hand-over costs relative to a forward of this tiny target, not a GPU's.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from flashfleet_trainer.config import parse_args  # noqa: E402
from flashfleet_trainer.data import load_data  # noqa: E402
from flashfleet_trainer.feed import InProcessFeed  # noqa: E402
from flashfleet_trainer.preflight import preflight  # noqa: E402
from flashfleet_trainer.trainer import MicroBatches  # noqa: E402
from flashfleet_trainer.vllm_target import VllmFeed, read_hidden  # noqa: E402

from tests.vllm_server import VllmServer  # noqa: E402


def _argv(tiny: Path, out: Path, *extra) -> list[str]:
    return ["--target-model", str(tiny / "model"), "--data-dir", str(tiny / "data"), "--output-dir", str(out),
            "--target-gpus", "cpu", "--drafter-gpus", "cpu", "--num-draft-layers", "2", "--target-layers", "1,2", "--use-soft-labels",
            "--max-seq-len", "96", "--token-budget", "1024", "--max-batch-size", "16", "--queue-depth", "2", *extra]


def _timed(feed, data, batches) -> tuple[float, int]:
    """Seconds to get every micro-batch's features through `feed`, and the tokens they hold."""
    feed.start(data, iter((0, i, idx) for i, idx in enumerate(batches)))
    t0, tokens = time.perf_counter(), 0
    for i, idx in enumerate(batches):
        tokens += int(feed.get((0, i), idx).lengths.sum())
    return time.perf_counter() - t0, tokens


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", type=Path, required=True, help="a tiny assets folder (platform/tiny-assets.sh)")
    p.add_argument("--batches", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ref_args = parse_args(_argv(a.tiny, tmp / "ref"))
        facts = preflight(ref_args)
        data = load_data(ref_args.data_dir, ref_args.max_seq_len, facts.vocab_size)
        batches = MicroBatches(data.lengths, ref_args).epoch(0)[: a.batches]
        layers, n_layers = facts.layer_ids, facts.num_target_layers
        server = VllmServer(a.tiny / "model", layers, n_layers, tmp / "shm", tmp / "server.log",
                            max_model_len=256).start()
        try:
            args = parse_args(_argv(a.tiny, tmp / "vllm", "--target-servers", server.url))
            vplan = preflight(args)
            rates = {"in-process": [], "vllm": []}
            for _ in range(a.repeats):
                s, n = _timed(InProcessFeed(ref_args, facts, "cpu", lambda s: None), data, batches)
                rates["in-process"].append(n / s)
                feed = VllmFeed.for_training(args, vplan, "cpu")
                s, n = _timed(feed, data, batches)
                feed.close()
                rates["vllm"].append(n / s)
            # The hand-over alone: a 255-token sequence's file, read and removed, ten times.
            seq, srv, nbytes, secs = list(range(1, 256)), vplan.servers[0], 0, 0.0
            for _ in range(10):
                path = srv.extract(seq)
                t0 = time.perf_counter()
                h = read_hidden(path, srv.url)["hidden_states"]
                secs += time.perf_counter() - t0
                nbytes += h.numel() * h.element_size()
        finally:
            server.stop()
    for k, v in rates.items():
        print(f"{k:>10}: {statistics.median(v):8.0f} target tokens/s (min {min(v):.0f}, max {max(v):.0f}, "
              f"{a.repeats} repeats of {len(batches)} micro-batches)")
    print(f"     ratio: vLLM / in-process = {statistics.median(rates['vllm']) / statistics.median(rates['in-process']):.2f}")
    print(f" hand-over: {nbytes / (10 * len(seq)):.0f} bytes per token ({len(vplan.servers)} server, layers "
          f"{layers} + the last, fp32); read + remove {secs / (nbytes / 2**30):.2f} s per GiB")


if __name__ == "__main__":
    main()

"""Serve an exported drafter with vLLM itself and measure what users will see: vLLM's mean
acceptance length on given prompts, and its greedy outputs.

Runs in vLLM's own environment (its venv; `PYTHONPATH` reaching this package), not the trainer's:
it imports nothing of flashfleet but the standard library and vLLM. The caller compares the figures
with `dflash-eval --drafter` on the same prompts (tests/unit/test_vllm_serve_drafter.py):

    python -m flashfleet_trainer.vllm_serve_check TARGET_DIR DRAFTER_DIR PROMPTS.json OUT.json \\
        [--max-new-tokens 16] [--dtype float32] [--max-model-len 256] [--temperature 0]
    python -m flashfleet_trainer.vllm_serve_check TARGET_DIR DRAFTER_DIR --check   # only: can this vLLM serve it

PROMPTS.json: a JSON list of prompts, each a list of token ids. Writes one JSON object to OUT.json
(vLLM logs on stdout): `tau`
(1 + accepted / drafts, vLLM's own counters: `vllm:spec_decode_num_drafts`, `..._num_accepted_tokens`),
the counters, `outputs` (each prompt's generated ids) and `vllm_version`.

Greedy unless --temperature is above 0 (then sampled from the full distribution, vLLM's
speculative sampling: the sampled acceptance of tests/benchmarks/bench_tau_settings.py),
`ignore_eos` (the project's evaluator generates max-new-tokens whatever the tokens), the engine
in its default multiprocess mode. `num_speculative_tokens` is the drafter's block size - 1 (the
block's first position is the anchor, known).
"""

import argparse
import json
import sys
from pathlib import Path

COUNTERS = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
            "accepted": "vllm:spec_decode_num_accepted_tokens"}
EX_CONFIG = 78  # flashfleet.contract.messages.EX_CONFIG (nothing of flashfleet is imported here; a test keeps them equal)


def block_size_problem(drafter, num_speculative_tokens) -> str | None:
    """Why serving DRAFTER with `num_speculative_tokens` would not measure the trained drafter, or
    None. The block size is part of a DFlash 2 drafter: vLLM places its convolution taps at
    row % (num_speculative_tokens + 1) and checks nothing (docs/export.md), so it must be
    block_size - 1; this check serves every drafter at its trained block."""
    raw = json.loads((Path(drafter) / "config.json").read_text())
    b = raw["block_size"]
    if num_speculative_tokens is None or num_speculative_tokens == b - 1:
        return None
    why = (f"vLLM would place the DFlash 2 convolution taps at row % {num_speculative_tokens + 1}, not at the "
           "trained block positions" if "DFlash2DraftModel" in (raw.get("architectures") or [])
           else "this check measures the drafter at its trained block")
    return (f"--num-speculative-tokens {num_speculative_tokens} for a drafter of block size {b}: {why} "
            f"(fix: pass --num-speculative-tokens {b - 1}, or leave it out)")


DFLASH2 = "DFlash2DraftModel"  # export.ARCHITECTURES["dflash2"]


def build_problem(drafter, on_cpu=None) -> str | None:
    """Why this vLLM cannot serve DRAFTER, or None. vLLM's CPU build loads a DFlash 2 drafter and
    then refuses to start it: its CPU model runner does not draft with the candidate selector (it
    would draft as plain DFlash), and its other runner needs Triton's GPU backend (docs/export.md).
    on_cpu: whether this vLLM is its CPU build (None: ask vLLM)."""
    raw = json.loads((Path(drafter) / "config.json").read_text())
    if DFLASH2 not in (raw.get("architectures") or []):
        return None
    if on_cpu is None:
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
    if not on_cpu:
        return None
    return (f"{drafter} is a DFlash 2 drafter ({DFLASH2}), and DFlash 2 needs vLLM's GPU build on the host: "
            "this vLLM is its CPU build, which refuses DFlash 2 drafters (fix: run the serve check on a host "
            "with vLLM's GPU build, or drop -e serve_check=true)")


def engine(target, drafter, dtype="float32", max_model_len=256):
    """vLLM's offline engine: the target, with DRAFTER as its DFlash drafter."""
    from vllm import LLM

    block_size = json.loads((Path(drafter) / "config.json").read_text())["block_size"]
    return LLM(model=str(target), dtype=dtype, enforce_eager=True, max_model_len=max_model_len,
               skip_tokenizer_init=True, disable_log_stats=False, seed=0,
               speculative_config={"method": "dflash", "model": str(drafter),
                                   "num_speculative_tokens": block_size - 1})


def _counts(llm) -> dict:
    counts = dict.fromkeys(COUNTERS, 0)
    for metric in llm.get_metrics():
        for key, name in COUNTERS.items():
            if metric.name == name:
                counts[key] += int(metric.value)
    return counts


def measure(llm, prompts, max_new_tokens, temperature=0.0) -> dict:
    """Generation on `prompts`, greedy (temperature 0) or sampled from the full distribution at
    `temperature` (vLLM's speculative sampling: the output is distributed as the target's); the
    counters are this call's own (vLLM's are cumulative)."""
    import vllm
    from vllm import SamplingParams

    params = SamplingParams(temperature=temperature, max_tokens=max_new_tokens, ignore_eos=True, detokenize=False)
    before = _counts(llm)
    results = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    counts = {k: v - before[k] for k, v in _counts(llm).items()}
    tau = 1 + counts["accepted"] / counts["drafts"] if counts["drafts"] else None
    block_size = llm.llm_engine.vllm_config.speculative_config.num_speculative_tokens + 1
    return {"tau": tau, **counts, "block_size": block_size, "temperature": temperature,
            "vllm_version": vllm.__version__, "outputs": [list(r.outputs[0].token_ids) for r in results]}


def serve(target, drafter, prompts, max_new_tokens, dtype="float32", max_model_len=256, temperature=0.0) -> dict:
    return measure(engine(target, drafter, dtype, max_model_len), prompts, max_new_tokens, temperature)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target")
    p.add_argument("drafter")
    p.add_argument("prompts", nargs="?", help="a JSON list of token id lists")
    p.add_argument("out", nargs="?", help="where to write the result (JSON)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-model-len", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default); above 0: sampled "
                   "(the engine's seed is 0)")
    p.add_argument("--num-speculative-tokens", type=int, default=None, metavar="N", help="refused unless the "
                   "drafter's block size - 1 (the default), what the engine is started with")
    p.add_argument("--check", action="store_true", help="only check that this vLLM serves DRAFTER (no engine, "
                   "no PROMPTS or OUT): exit 0, or 78 with one line")
    a = p.parse_args(argv)
    if not a.check and a.out is None:
        p.error("PROMPTS and OUT are required unless --check")
    problem = block_size_problem(a.drafter, a.num_speculative_tokens) or build_problem(a.drafter)
    if problem:
        print(f"flashfleet-train: config error: {problem}", file=sys.stderr)
        return EX_CONFIG
    if a.check:
        return 0
    prompts = json.loads(Path(a.prompts).read_text())
    result = serve(a.target, a.drafter, prompts, a.max_new_tokens, a.dtype, a.max_model_len, a.temperature)
    Path(a.out).write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import os
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


EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def sampling_problem() -> str | None:
    """Why this vLLM's sampled (temperature > 0) speculative decoding is not the drafter's, or None.

    vLLM 0.32.0's CPU build has no Triton backend, so it swaps the rejection sampler's Triton
    kernels for C++ ones (platforms/cpu.py `register_triton_kernel_overrides`). The one that spreads
    each request's temperature, top-k and top-p over its draft rows
    (utils/cpu_triton_utils.py `_expand_kernel_impl`) hands the C++ op int64 copies of its float
    output and input, so the output is never written: the target's logits at the drafted positions
    are divided by uninitialised memory, draft tokens are judged and replaced by tokens sampled from
    garbage, and the acceptance length comes out about 15% low on the real-text tiny target.
    Greedy requests never reach it. Found by running the op (this function): the rows must come
    back as [1.0, 1.0, 0.7, 0.7]."""
    import torch
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    got = expand_batch_to_tokens(torch.tensor([1.0, 0.7]), torch.tensor([2, 4], dtype=torch.int32), 4,
                                 replace_from=0, replace_to=1)
    if torch.allclose(got, torch.tensor([1.0, 1.0, 0.7, 0.7])):
        return None
    return ("this vLLM spreads a sampled request's temperature over its draft tokens wrongly (its CPU build's "
            f"expand kernel gave {[round(float(x), 4) for x in got]} for [1.0, 1.0, 0.7, 0.7]), so its "
            "acceptance length at temperature > 0 is not the drafter's")


def _expand_rows(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """The expand kernel's job in torch: each request's value repeated over its rows, replace_from
    read as replace_to, written into `output` (the launch's own argument names and order)."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    vals = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    rows = vals.repeat_interleave(counts)
    output[:rows.numel()] = rows.to(output.dtype)


def fix_sampling() -> str | None:
    """Benchmarks only (tests/benchmarks/vllm_judge.py), never serving: where sampling_problem()
    finds the CPU build's expand kernel broken, replace it in this process with _expand_rows (also
    for the worker's own registration, which reads the module attribute) and keep the engine in
    this process, where the replacement lives. Returns what was changed (recorded with every
    figure measured so), or None where nothing needed it; raises if the fix did not take."""
    if sampling_problem() is None:
        return None
    from vllm.triton_utils.dispatcher import register_kernels
    from vllm.utils import cpu_triton_utils

    cpu_triton_utils._expand_kernel_impl = _expand_rows
    register_kernels({EXPAND_KERNEL: _expand_rows})
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    still = sampling_problem()
    if still:
        raise RuntimeError(f"fix_sampling did not take: {still}")
    return f"{EXPAND_KERNEL} replaced by flashfleet_trainer.vllm_serve_check._expand_rows (engine in-process)"


def engine(target, drafter, dtype="float32", max_model_len=256, draft_sample_method="greedy"):
    """vLLM's offline engine: the target, with DRAFTER as its DFlash drafter. draft_sample_method:
    how a sampled request's drafts are drawn (vLLM's speculative config: greedy, its default, or
    probabilistic, drawn from the drafter's distribution)."""
    from vllm import LLM

    block_size = json.loads((Path(drafter) / "config.json").read_text())["block_size"]
    return LLM(model=str(target), dtype=dtype, enforce_eager=True, max_model_len=max_model_len,
               skip_tokenizer_init=True, disable_log_stats=False, seed=0,
               speculative_config={"method": "dflash", "model": str(drafter),
                                   "num_speculative_tokens": block_size - 1,
                                   "draft_sample_method": draft_sample_method})


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
            "draft_sample_method": llm.llm_engine.vllm_config.speculative_config.draft_sample_method,
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
    if a.temperature > 0 and (problem := sampling_problem()):
        print(f"flashfleet-train: config error: {problem} (fix: measure at --temperature 0, or on vLLM's GPU "
              "build; docs/export.md)", file=sys.stderr)
        return EX_CONFIG
    prompts = json.loads(Path(a.prompts).read_text())
    result = serve(a.target, a.drafter, prompts, a.max_new_tokens, a.dtype, a.max_model_len, a.temperature)
    Path(a.out).write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

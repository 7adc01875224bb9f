"""vLLM itself judging one DFlash drafter at several temperatures with one engine start (benchmarks).

    python tests/benchmarks/vllm_judge.py TARGET PROMPTS.json OUT.json DRAFTER [--max-new-tokens N] \
        [--temperatures 0,1] [--max-model-len 512] [--draft-sample-method greedy|probabilistic]

Run with the vLLM venv's Python, PYTHONPATH reaching trainer/. The engine (flashfleet_trainer.
vllm_serve_check.engine) starts once and measures the drafter at each temperature with
vllm_serve_check.measure, whose counters are that call's own, the prefix cache emptied before each
(the cached prompts would otherwise skip the drafts of the next call's prefill). Loading the next
drafter into a running engine does not work on the CPU build: its linear layers hand their weights
to packed GEMM kernels after loading and keep empty parameters, which vLLM's loader then refuses
("Attempted to load weight (torch.Size([128, 256])) into parameter (torch.Size([0]))"). Where a
temperature above 0 is asked for and the CPU build's expand kernel is broken
(vllm_serve_check.sampling_problem), it is replaced in this process first (fix_sampling): the
sampled figures are then vLLM's rejection sampling as it is meant to run, and each result records
the replacement under "sampling_fix". OUT.json: {"drafter", "results": [one measure() result per
temperature, without the outputs]}.
"""

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target")
    p.add_argument("prompts", help="a JSON list of token id lists")
    p.add_argument("out")
    p.add_argument("drafter")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--draft-sample-method", choices=("greedy", "probabilistic"), default="greedy",
                   help="how vLLM draws a sampled request's drafts (its speculative config; greedy is its default)")
    a = p.parse_args(argv)
    from flashfleet_trainer import vllm_serve_check as check

    prompts = json.loads(Path(a.prompts).read_text())
    temperatures = [float(x) for x in a.temperatures.split(",")]
    fix = check.fix_sampling() if any(t > 0 for t in temperatures) else None  # before the engine starts
    llm = check.engine(a.target, a.drafter, "float32", a.max_model_len, a.draft_sample_method)
    res = []
    for t in temperatures:
        llm.reset_prefix_cache()
        r = check.measure(llm, prompts, a.max_new_tokens, t)
        res.append({k: v for k, v in r.items() if k != "outputs"} | {"sampling_fix": fix})
        print(f"vllm_judge: {a.drafter} T={t:g}: tau {r['tau']:.4f}", flush=True)
    Path(a.out).write_text(json.dumps({"drafter": a.drafter, "results": res}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""vLLM itself judging one DFlash drafter at several temperatures with one engine start (benchmarks).

    python tests/benchmarks/vllm_judge.py TARGET PROMPTS.json OUT.json DRAFTER [--max-new-tokens N] \
        [--temperatures 0,1] [--max-model-len 512]

Run with the vLLM venv's Python, PYTHONPATH reaching trainer/. The engine (flashfleet_trainer.
vllm_serve_check.engine) starts once and measures the drafter at each temperature with
vllm_serve_check.measure, whose counters are that call's own, the prefix cache emptied before each
(the cached prompts would otherwise skip the drafts of the next call's prefill). Loading the next
drafter into a running engine does not work on the CPU build: its linear layers hand their weights
to packed GEMM kernels after loading and keep empty parameters, which vLLM's loader then refuses
("Attempted to load weight (torch.Size([128, 256])) into parameter (torch.Size([0]))"). OUT.json:
{"drafter", "results": [one measure() result per temperature, without the outputs]}.
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
    a = p.parse_args(argv)
    from flashfleet_trainer import vllm_serve_check as check

    prompts = json.loads(Path(a.prompts).read_text())
    llm = check.engine(a.target, a.drafter, "float32", a.max_model_len)
    res = []
    for t in (float(x) for x in a.temperatures.split(",")):
        llm.reset_prefix_cache()
        r = check.measure(llm, prompts, a.max_new_tokens, t)
        res.append({k: v for k, v in r.items() if k != "outputs"})
        print(f"vllm_judge: {a.drafter} T={t:g}: tau {r['tau']:.4f}", flush=True)
    Path(a.out).write_text(json.dumps({"drafter": a.drafter, "results": res}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

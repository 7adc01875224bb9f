"""vLLM's CPU build serving DFlash 2 drafters, for the tests only: never a way to serve one.

vLLM 0.32.0 loads a DFlash 2 directory (`architectures: ["DFlash2DraftModel"]`) on CPU but refuses
to start it: its old model runner refuses candidate-head drafts on purpose, and its new runner
needs Triton, whose PyPI build has no CPU backend. This script, run with the vLLM venv's Python,
changes three things in its own process before vLLM is imported, and nothing on disk:

1. the new model runner, in-process (VLLM_USE_V2_MODEL_RUNNER=1, VLLM_ENABLE_V1_MULTIPROCESSING=0:
   the patches below live in this process only);
2. Triton's interpreter (TRITON_INTERPRET=1) runs the runner's kernels in numpy, and a stand-in
   "cpu" entry in triton.backends.backends makes vLLM keep Triton on (it turns Triton off on its
   CPU build unless that key exists; the interpreter never asks the entry for anything);
3. the interpreter's masked load and store take their mask as bool: Triton 3.9's interpreter
   evaluates `block_mask & scalar_bool` as int32 and then refuses it ("mask has unsupported
   dtype", in vLLM's candidate walk).

    python tests/vllm_dflash2.py TARGET PROMPTS.json OUT.json DRAFTER [DRAFTER ...] [--max-new-tokens N]

One engine start: the engine starts with the first DRAFTER; each later one (the same shapes) is
loaded into that engine's drafter through vLLM's own loader (`load_weights`), with the prefix
cache emptied (it holds the previous drafter's K/V). OUT.json: one result per DRAFTER, as
flashfleet_trainer.vllm_serve_check writes it (its `tau` from the counters of that drafter's
requests only). PYTHONPATH must reach trainer/.
"""

import argparse
import json
import os
import sys
from pathlib import Path


def test_only_setup():
    """The three changes above; call before anything imports vLLM."""
    os.environ.update({"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                       "TRITON_INTERPRET": "1"})
    import numpy as np
    import triton.backends
    from triton.runtime import interpreter

    class _NoDriver:  # the entry's driver; under the interpreter nothing calls it
        @staticmethod
        def is_active():
            return False

    triton.backends.backends.setdefault("cpu", triton.backends.Backend(compiler=None, driver=_NoDriver))

    builder = interpreter.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store

    def as_bool(mask):
        return interpreter.TensorHandle(np.asarray(mask.data).astype(bool), mask.dtype)

    builder.create_masked_load = lambda self, ptrs, mask, *a: load(self, ptrs, as_bool(mask), *a)
    builder.create_masked_store = lambda self, ptrs, value, mask, *a: store(self, ptrs, value, as_bool(mask), *a)

    import torch
    from vllm.model_executor.layers import utils as layer_utils

    def plain_linear(layer, remove_weight):
        layer.cpu_linear = torch.nn.functional.linear

    layer_utils.dispatch_cpu_unquantized_gemm = plain_linear


def _load_drafter(worker, drafter_dir):
    """In the engine: DRAFTER_DIR's weights into the running drafter, through vLLM's own loader
    (which also rebuilds the drafter's fused context-K/V buffers from them)."""
    from safetensors.torch import load_file

    weights = {}
    for f in sorted(Path(drafter_dir).glob("*.safetensors")):
        weights.update(load_file(f))
    worker.model_runner.speculator.model.load_weights(weights.items())
    return len(weights)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target")
    p.add_argument("prompts", help="a JSON list of token id lists")
    p.add_argument("out", help="where to write the results (a JSON list, one per drafter)")
    p.add_argument("drafters", nargs="+")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=256)
    a = p.parse_args(argv)
    test_only_setup()
    from flashfleet_trainer import vllm_serve_check as check

    first = json.loads((Path(a.drafters[0]) / "config.json").read_text())
    for d in a.drafters[1:]:
        other = json.loads((Path(d) / "config.json").read_text())
        if {k: v for k, v in other.items() if k != "flashfleet"} != {k: v for k, v in first.items() if k != "flashfleet"}:
            sys.exit(f"vllm_dflash2: {d} has another config than {a.drafters[0]}: one engine serves drafters of one shape")
    prompts = json.loads(Path(a.prompts).read_text())
    llm = check.engine(a.target, a.drafters[0], "float32", a.max_model_len)
    results = []
    for i, d in enumerate(a.drafters):
        if i:
            llm.collective_rpc(_load_drafter, args=(str(Path(d).resolve()),))
            llm.reset_prefix_cache()
        results.append(check.measure(llm, prompts, a.max_new_tokens))
    Path(a.out).write_text(json.dumps(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""torch.compile for the frozen target's decoder layers, and the recompile limit every compiled
path of the trainer raises (the target's layers, the drafter's fused elementwise ops, flex_attention).
"""

import torch


def raise_recompile_limit(limit=64):
    """Let each compiled function keep up to `limit` specializations (dynamo's default, 8, is too few
    for a run's length groups, flex buckets, dtypes and grad modes): raised, never lowered."""
    import torch._dynamo

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), limit))


CACHE_KWARGS = ("cache", "past_key_values", "past_key_value")  # what transformers names a layer's KV cache, by version


def cache_kwarg(module) -> str:
    """The name `module.forward` takes its KV cache by: `cache` from transformers 5.24 (where
    `past_key_values` still works until 5.40, with a warning), `past_key_values` before."""
    import inspect

    params = inspect.signature(module.forward).parameters
    return next((k for k in CACHE_KWARGS if k in params), "past_key_values")


class _CompiledUnlessCached:
    """A decoder layer's forward, compiled (dynamic shapes) for the training forwards, which carry
    no KV cache; the evaluator's cached forwards (`past_key_values`) keep the eager one, so a cache
    object never enters a compiled graph."""

    def __init__(self, eager, backend, mode=None):
        self.eager, self.compiled = eager, torch.compile(eager, dynamic=True, backend=backend, mode=mode)

    def __call__(self, *args, **kwargs):
        cached = any(kwargs.get(k) is not None for k in CACHE_KWARGS)
        return (self.eager if cached else self.compiled)(*args, **kwargs)


def compile_decoder_layers(model, backend="inductor", mode=None) -> int:
    """Compile each decoder layer's forward in place (the forward hooks stay outside the graph):
    inductor fuses the memory-bound work around the GEMMs (RMSNorm's fp32 round trip, RoPE, SwiGLU,
    residual adds), 1.29x target tokens/s at the Qwen3-8B shape on one H200 (docs/benchmarks.md).
    Every layer of a stack shares one compiled graph per layer class. A hybrid stack's
    linear-attention layers are compiled in parts instead (`_compile_parts`): their token mixer
    calls flash-linear-attention's Triton kernels, which compiling the whole layer around did not
    finish in minutes. `mode` is torch.compile's (None: inductor's default). Returns the layers
    compiled, whole or in parts."""
    raise_recompile_limit()  # length groups: a few batch/length specializations at most
    layers = model.get_decoder().layers
    for layer in layers:
        if hasattr(layer, "linear_attn"):
            _compile_parts(layer, backend, mode)
        elif not isinstance(layer.forward, _CompiledUnlessCached):
            layer.forward = _CompiledUnlessCached(layer.forward, backend, mode)
    return len(layers)


def _compile_parts(layer, backend, mode=None) -> None:
    """A linear-attention layer's norms (its gated output norm too) and MLP compiled in place: the
    same fusions as a whole layer's, the token mixer between them eager. None of them takes a cache."""
    for sub in (layer.input_layernorm, layer.post_attention_layernorm, layer.mlp, layer.linear_attn.norm):
        if not hasattr(sub.forward, "_torchdynamo_orig_callable"):  # compiled already
            sub.forward = torch.compile(sub.forward, dynamic=True, backend=backend, mode=mode)


def compiled_by_default(device) -> bool:
    """Whether a target replica's layers are compiled (`compile_decoder_layers`) unless told not to:
    on CUDA (1.29x target tokens/s at the Qwen3-8B shape, 1.16x at the Qwen3.6-27B hybrid shape, on
    one H200; docs/benchmarks.md), where inductor's kernels run; a CPU target stays eager."""
    return torch.device(device).type == "cuda"


def compile_note(layers: int) -> str:
    """The status line of a compiled target replica: the compile happens inside the first forward,
    so say why that micro-batch is slow (first target forwards measured on one H200)."""
    return (f"{layers} decoder layers compile in the first micro-batch (under 20 s at the Qwen3-8B shape; "
            "about 85 s at the Qwen3.6-27B shape, whose linear-attention kernels also autotune)")

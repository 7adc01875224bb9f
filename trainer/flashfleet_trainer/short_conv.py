"""A hybrid target's short convolution (Gated DeltaNet's depthwise causal conv1d, then SiLU) through
flash-linear-attention's Triton kernel.

transformers binds `causal_conv1d_fn` in its Qwen3.5/3.6 modeling modules to the causal-conv1d
package when that imports, else to torch's grouped conv1d. causal-conv1d is not in the CUDA lock
(PyPI has only its source, which compiles CUDA at install), so the torch path ran: a strided copy
of the transposed projection, a generic depthwise kernel (6.6% of the 27B target's GPU time on one
H200, the copy most of another 8.7%), a SiLU pass; this kernel made the target 1.10x faster
(docs/benchmarks.md, "The target").
flash-linear-attention, in the lock for the gated delta rule, has the same operation as one Triton
kernel on the [B, T, C] layout the input projection already has.

`bind()` puts that kernel where transformers looks the function up (`target.fast_kernels` binds it
only where transformers chose its torch fallback, for a CUDA target); the bound function hands CPU
tensors and any call it does not take to the fallback it replaced.
"""

import importlib

KERNEL_MODULE = "fla.modules.causal_conv1d"
BOUND = "bound_kernel"  # attribute of a bound function: the module of the kernel it runs
_bound = set()  # the modules bind() changed, for unbind()


def fla_kernel():
    """flash-linear-attention's causal_conv1d, or None where it does not import."""
    try:
        return importlib.import_module(KERNEL_MODULE).causal_conv1d
    except Exception:  # not installed, or its Triton backends fail to import: keep torch's path
        return None


def conv1d_silu(fallback, kernel, devices=("cuda",)):
    """A function with transformers' `causal_conv1d_fn` signature (hidden_states [B, C, T], the
    transpose of the projection's [B, T, C]; weight [C, W]) that runs `kernel` (fla's contract:
    x [B, T, C] -> (y [B, T, C], state)) on tensors of `devices` and `fallback` otherwise."""

    def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
        if (hidden_states.device.type not in devices or activation not in (None, "silu", "swish")
                or kwargs.get("seq_idx") is not None):
            return fallback(hidden_states, weight, bias, activation=activation, **kwargs)
        x = hidden_states.transpose(1, 2).contiguous()  # the projection's own [B, T, C]: no copy
        y, _ = kernel(x, weight.to(x.dtype), bias, activation=activation, cu_seqlens=kwargs.get("cu_seqlens"))
        return y.transpose(1, 2)

    setattr(causal_conv1d_fn, BOUND, KERNEL_MODULE)
    causal_conv1d_fn.fallback = fallback
    return causal_conv1d_fn


def bind(modules) -> list[str]:
    """Bind fla's kernel as `causal_conv1d_fn` in each of `modules` (transformers' hybrid modeling
    modules whose function it left on torch: `target.torch_conv_modules`); idempotent. Returns the
    modules bound (none without fla)."""
    kernel = fla_kernel()
    if kernel is None:
        return []
    for name in modules:
        mod = importlib.import_module(name)
        if getattr(mod.causal_conv1d_fn, BOUND, None) is None:
            mod.causal_conv1d_fn = conv1d_silu(mod.causal_conv1d_fn, kernel)
            _bound.add(name)
    return list(modules)


def unbind() -> None:
    """Give each module `bind` changed back the function it replaced."""
    for name in sorted(_bound):
        mod = importlib.import_module(name)
        mod.causal_conv1d_fn = mod.causal_conv1d_fn.fallback
    _bound.clear()

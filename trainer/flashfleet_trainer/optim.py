"""The drafter's optimizer: AdamW (fused on CUDA), with gradient clipping folded into its update.

`clip_grad_norm_` then `step()` reads every fp32 gradient three times: once for the norm, once to
scale it, once in the update. The fused AdamW kernel can divide each gradient by a device scalar
as it reads it (`grad_scale`, the hook torch.amp's GradScaler uses to unscale), so clipping needs
only the norm pass: `grad_scale = max(norm / max_norm, 1)` is clip_grad_norm_'s factor inverted.
The same hook's `found_inf` makes the kernel skip the update where the norm is not finite, so a
NaN or inf gradient leaves the weights and the moments as they were (clip_grad_norm_ then step
would have written NaN into both). Nothing here waits on the host.
"""

import torch

# clip_grad_norm_'s guard against a zero norm, kept so both paths clip by the same factor.
_EPS = 1e-6


def adamw(params, lr: float, weight_decay: float, device: str, fused: bool | None = None) -> torch.optim.AdamW:
    """The drafter's AdamW: fused (one kernel for the whole update) on CUDA, foreach elsewhere,
    unless `fused` says otherwise."""
    fused = str(device).startswith("cuda") if fused is None else fused
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95), eps=1e-8,
                             fused=fused or None)


def clipped_step(opt: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
    """Clip the gradients to total 2-norm `max_norm` (inf: no clipping), take the optimizer step, and
    return the norm before clipping (a device tensor)."""
    params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
    if not all(g.get("fused") for g in opt.param_groups):
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        opt.step()
        return norm
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
    opt.grad_scale = torch.clamp((norm + _EPS) / max_norm, min=1.0)
    opt.found_inf = (~torch.isfinite(norm)).float()
    try:
        opt.step()
    finally:  # a later plain step() must not reuse them
        del opt.grad_scale, opt.found_inf
    return norm

"""The trainer's route to the loss (`get_loss_fn` + `drafter_loss`) with the Triton kernel, under the
interpreter when there is no GPU: the kernel and the one torch reference give the same loss, gradient,
streak weights (computed chunk by chunk from the kernel's own CE) and statistics."""

import functools

import pytest
import torch
from flashfleet_kernels import triton_fused_linear_distill_loss
from flashfleet_trainer.loss import IGNORE, drafter_loss, get_loss_fn

needs_triton = pytest.mark.skipif(triton_fused_linear_distill_loss is None, reason="triton not importable")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@needs_triton
@pytest.mark.parametrize("chunk_blocks", [None, 1])  # 1: a chunk per block, so later chunks start past row 0
@pytest.mark.parametrize("weighting", ["streak", "decay"])
def test_triton_route_matches_the_reference(weighting, chunk_blocks):
    g = torch.Generator().manual_seed(7)
    n, b, h, v = 6, 4, 16, 300
    hs, ht = torch.randn(n, b, h, generator=g), torch.randn(n, b, h, generator=g)
    w_head = torch.randn(v, h, generator=g) * 0.5
    y = torch.randint(0, v, (n, b), generator=g)
    y[:, 0] = IGNORE
    y[2, 1:] = IGNORE
    hs, ht, w_head, y = (t.to(DEVICE) for t in (hs, ht, w_head, y))
    kw = dict(weighting=weighting, use_soft_labels=True, kl_temperature=2.0, kl_weight=0.6)
    out = {}
    for impl in ("triton", "torch"):
        fn, name = get_loss_fn(impl)
        assert name == impl
        if impl == "triton" and chunk_blocks:  # the loss's rows are a block's predicted positions
            fn = functools.partial(fn, chunk_size=chunk_blocks * (b - 1))
        x = hs.clone().requires_grad_()
        loss, st = drafter_loss(x, ht, w_head, y, loss_fn=fn, **kw)
        loss.backward()
        out[impl] = loss, x.grad, st
    (loss, grad, st), (r_loss, r_grad, r_st) = out["triton"], out["torch"]
    torch.testing.assert_close(loss, r_loss, atol=2e-5, rtol=2e-4)
    torch.testing.assert_close(grad, r_grad, atol=2e-6, rtol=2e-4)
    torch.testing.assert_close(st["weights"], r_st["weights"], atol=1e-5, rtol=1e-5)
    assert st["ce"] == pytest.approx(r_st["ce"], rel=1e-4)
    assert st["kl"] == pytest.approx(r_st["kl"], rel=1e-3)
    assert st["correct"] == r_st["correct"] and st["rows"] == r_st["rows"]


def _fp8_problem():
    from flashfleet_kernels.distill_loss import fp8_support_problem

    return fp8_support_problem(torch.device(DEVICE), torch.bfloat16 if DEVICE == "cuda" else torch.float32)


@needs_triton
def test_teacher_fp8_reaches_the_kernel_through_the_trainer_route():
    """dflash-train --teacher-fp8 binds teacher_fp8 into the loss function: the route's loss is the
    FP8 path's (the kernel called directly with teacher_fp8=True), not the default path's."""
    from flashfleet_kernels import fused_linear_distill_loss

    if _fp8_problem() is not None:
        pytest.skip(f"no row-wise FP8 GEMM here: {_fp8_problem()}")
    g = torch.Generator().manual_seed(3)
    n, b, h, v = 6, 4, 32, 304  # FP8 GEMMs need the head's sizes to be multiples of 16
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    hs, ht = (torch.randn(n, b, h, generator=g).to(DEVICE, dtype) for _ in range(2))
    w_head = (torch.randn(v, h, generator=g) * 0.5).to(DEVICE, dtype)
    y = torch.randint(0, v, (n, b), generator=g).to(DEVICE)
    y[:, 0] = IGNORE
    fn, name = get_loss_fn("triton", teacher_fp8=True)
    assert name == "triton+teacher_fp8"
    loss, _ = drafter_loss(hs, ht, w_head, y, loss_fn=fn, weighting="decay", use_soft_labels=True,
                           kl_temperature=2.0, kl_weight=0.7)
    w = drafter_loss(hs, ht, w_head, y, loss_fn=get_loss_fn("triton")[0], weighting="decay", use_soft_labels=True,
                     kl_temperature=2.0, kl_weight=0.7)[1]["weights"]
    direct = {fp8: fused_linear_distill_loss(hs, ht, w_head, y, w, temperature=2.0, kl_weight=0.7, impl="triton",
                                             teacher_fp8=fp8) for fp8 in (True, False)}
    assert float(direct[True]) != float(direct[False])  # the two paths are told apart at this shape
    torch.testing.assert_close(loss, direct[True], atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="teacher_fp8 is an option of the Triton path"):
        get_loss_fn("torch", teacher_fp8=True)[0](hs, ht, w_head, y, w, temperature=2.0, kl_weight=0.7)

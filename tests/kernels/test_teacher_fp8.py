"""``teacher_fp8``: FP8 teacher logits (row-wise scales), on CPU under the Triton interpreter.

torch._scaled_mm has a CPU implementation with row-wise scales (fp32 out), so the path's own code
(quantization, scale orientation, the head's cache, the early errors) runs here on small shapes
(on a GPU the same tests run in bf16); real shapes on a GPU are in test_distill_loss_cuda.py. The
oracle is the fp32 reference fed the test's own dequantized teacher. Rows of h_t and of W have very
different magnitudes, so scales applied to the wrong rows miss it by far more than the tolerance
(a scale along the wrong axis cannot run at all).
"""

import gc
import math

import pytest
import torch
from flashfleet_kernels import (
    fused_linear_distill_loss,
    reference_fused_linear_distill_loss,
    triton_fused_linear_distill_loss,
)

if triton_fused_linear_distill_loss is not None:
    from flashfleet_kernels import distill_loss as dl

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # the interpreter has no bf16
N, V, D = 37, 1008, 48  # FP8 GEMMs need V and d multiples of 16
KW = dict(temperature=2.0, kl_weight=0.7)
# Fused FP8 path against the oracle: fp32 logits agree to summation order; bf16 logits (a GPU) round.
TOL = {torch.float32: dict(loss=1e-5, grad=1e-4, ce=2e-5), torch.bfloat16: dict(loss=2e-3, grad=3e-2, ce=0.1)}[DTYPE]

needs_fp8 = pytest.mark.skipif(
    triton_fused_linear_distill_loss is None or dl.fp8_support_problem(torch.device(DEVICE), DTYPE) is not None,
    reason="needs triton and torch._scaled_mm with row-wise FP8 scales here")


def _inputs(n=N, v=V, d=D, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h_s = torch.randn(n, d, generator=gen)
    # Row magnitudes spread over ~e^{+-1.5} (h_t) and e^{+-1} (W): each row's scale is its own.
    h_t = (h_s + 0.7 * torch.randn(n, d, generator=gen)) * torch.exp(3 * torch.rand(n, 1, generator=gen) - 1.5)
    weight = torch.randn(v, d, generator=gen) * (2.0 / math.sqrt(d)) * torch.exp(2 * torch.rand(v, 1, generator=gen) - 1)
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[[3, n - 1]] = -100
    row_weights = torch.rand(n, generator=gen) * 2
    row_weights[0] = 0.0
    return [t.to(device=DEVICE, dtype=DTYPE) if t.is_floating_point() else t.to(DEVICE)
            for t in (h_s, h_t, weight, labels)] + [row_weights.to(DEVICE)]


def dequant(x, dim=1):
    """The spec, written out: one scale per slice along ``dim``, ``amax / 448``, round to e4m3fn."""
    scale = x.float().abs().amax(dim=dim, keepdim=True) / 448.0
    return (x.float() / scale).to(torch.float8_e4m3fn).float() * scale


def oracle(h_s, h_t, weight, labels, row_weights, teacher, head, **kw):
    """The fp32 reference with teacher logits ``teacher @ head^T``: hidden states and head are joined
    along d, ``[h_s, 0] . [W, head]`` and ``[0, teacher] . [W, head]``; returns (loss, grad h_s, row CE)."""
    zero = torch.zeros_like(h_s, dtype=torch.float32)
    hs = torch.cat([h_s.float(), zero], 1).requires_grad_()
    loss, ce, _ = reference_fused_linear_distill_loss(
        hs, torch.cat([zero, teacher.float()], 1), torch.cat([weight.float(), head.float()], 1), labels,
        row_weights, return_row_stats=True, **kw)
    loss.backward()
    return loss.item(), hs.grad[:, :h_s.shape[1]], ce


def fused(h_s, h_t, weight, labels, row_weights, **kw):
    hs = h_s.detach().clone().requires_grad_()
    loss, ce, ok = triton_fused_linear_distill_loss(hs, h_t, weight, labels, row_weights, return_row_stats=True,
                                                    chunk_size=16, block_size=256, **kw)
    loss.backward()
    return loss.item(), hs.grad.float(), ce, ok


def close(a, b, tol):
    return abs(a - b) <= tol * abs(b)


def grad_rel(g, ref):
    return ((g - ref).norm() / ref.norm()).item()


@needs_fp8
@pytest.mark.parametrize("temperature, kl_weight", [(2.0, 0.7), (1.0, 1.0)])
def test_fp8_teacher_matches_dequantized_oracle_and_not_a_wrong_scale(temperature, kl_weight):
    inputs = _inputs()
    h_s, h_t, weight, labels, row_weights = inputs
    kw = dict(temperature=temperature, kl_weight=kl_weight)
    loss, grad, ce, _ = fused(*inputs, teacher_fp8=True, **kw)
    o_loss, o_grad, o_ce = oracle(*inputs, dequant(h_t), dequant(weight), **kw)
    assert close(loss, o_loss, TOL["loss"]), (loss, o_loss)
    assert grad_rel(grad, o_grad) < TOL["grad"]
    assert (ce - o_ce).abs().max() < TOL["ce"]
    # Scales on the wrong rows (W's or h_t's in reverse order) miss the oracle's gradient by more than
    # ten times the tolerance (measured on CPU: ~1.0 relative); a transposed scale cannot even run.
    w_scale = weight.float().abs().amax(1, keepdim=True) / 448.0
    h_scale = h_t.float().abs().amax(1, keepdim=True) / 448.0
    wrong_w = (weight.float() / w_scale).to(torch.float8_e4m3fn).float() * w_scale.flip(0)
    wrong_h = (h_t.float() / h_scale).to(torch.float8_e4m3fn).float() * h_scale.flip(0)
    for teacher, head in ((dequant(h_t), wrong_w), (wrong_h, dequant(weight))):
        w_loss, w_grad, _ = oracle(*inputs, teacher, head, **kw)
        assert grad_rel(grad, w_grad) > 10 * TOL["grad"] and not close(loss, w_loss, TOL["loss"])
    # and from the exact teacher no further than FP8's rounding (3 mantissa bits) explains
    r_loss, r_grad, r_ce = oracle(*inputs, h_t, weight, **kw)
    assert close(loss, r_loss, 2e-2), (loss, r_loss)
    assert grad_rel(grad, r_grad) < 0.15
    assert (ce - r_ce).abs().max() < TOL["ce"]  # the student side is untouched


@needs_fp8
def test_a_vocabulary_not_a_multiple_of_16_is_padded():
    """A 1,000-row head (the byte-vocabulary tiny targets have 258): its FP8 copy has 1,008 rows, the
    last 8 zero, and the loss still equals the dequantized oracle over the 1,000 real rows."""
    inputs = _inputs(v=1000, seed=2)
    h_s, h_t, weight, labels, row_weights = inputs
    dl.clear_fp8_heads()
    w8, w_scale = dl.fp8_head(weight)
    assert w8.shape == (1008, D) and w_scale.shape == (1, 1008)
    assert torch.all(w8[1000:].float() == 0)
    loss, grad, ce, _ = fused(*inputs, teacher_fp8=True, **KW)
    o_loss, o_grad, o_ce = oracle(*inputs, dequant(h_t), dequant(weight), **KW)
    assert close(loss, o_loss, TOL["loss"]), (loss, o_loss)
    assert grad_rel(grad, o_grad) < TOL["grad"]
    assert (ce - o_ce).abs().max() < TOL["ce"]
    z = dl.fp8_teacher_logits(h_t, (w8, w_scale), 1000, DTYPE)
    assert z.shape == (N, 1000)
    torch.testing.assert_close(z.float(), dequant(h_t) @ dequant(weight).t(), atol=TOL["ce"], rtol=TOL["loss"] * 10)


@needs_fp8
def test_fp8_teacher_against_default_path():
    inputs = _inputs(seed=1)
    loss, grad, ce, ok = fused(*inputs, teacher_fp8=True, **KW)
    b_loss, b_grad, b_ce, b_ok = fused(*inputs, teacher_fp8=False, **KW)
    assert torch.equal(ce, b_ce) and torch.equal(ok, b_ok)  # student logits: the same GEMM
    assert close(loss, b_loss, 2e-2)
    assert torch.nn.functional.cosine_similarity(grad.flatten(), b_grad.flatten(), dim=0) > 0.98  # 0.995 measured
    dropped = (inputs[3] == -100) | (inputs[4] == 0)
    assert torch.all(grad[dropped] == 0)


@needs_fp8
def test_transposed_scales_are_refused():
    """The GEMM itself rejects a scale along the wrong axis, so only wrong rows can be silent."""
    h8, h_scale = dl.quantize_rows_fp8(torch.randn(32, D, dtype=DTYPE, device=DEVICE))
    w8, w_scale = dl.quantize_rows_fp8(torch.randn(V, D, dtype=DTYPE, device=DEVICE))
    torch._scaled_mm(h8, w8.t(), h_scale, w_scale.t(), out_dtype=DTYPE)  # [32, 1] and [1, V]: fine
    for a, b in ((h_scale, w_scale), (h_scale.t(), w_scale.t()), (w_scale.t()[:, :D], w_scale.t())):
        with pytest.raises((RuntimeError, ValueError)):  # which one depends on the torch version
            torch._scaled_mm(h8, w8.t(), a.contiguous(), b.contiguous(), out_dtype=DTYPE)


@needs_fp8
def test_quantize_rows_fp8():
    x = torch.randn(5, 64, dtype=DTYPE, device=DEVICE) * torch.tensor([1e-3, 1.0, 30.0, 1.0, 0.0], device=DEVICE)[:, None]
    q, s = dl.quantize_rows_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (5, 1) and s.dtype == torch.float32
    deq = q.float() * s
    assert torch.all(q.float().abs().amax(1)[:4] == 448)  # each row's max maps to e4m3fn's largest value
    err = (deq - x.float()).abs()
    assert torch.all(err <= (x.float().abs() / 16 + s * 2.0**-10) * (1 + 1e-6))  # half a unit of 3 bits
    assert torch.all(deq[4] == 0) and torch.isfinite(deq).all()  # an all-zero row stays 0, no NaN


@needs_fp8
def test_fp8_head_cache_follows_the_head():
    *_, weight, labels, row_weights = _inputs()
    small = dict(n=19, v=528, d=32)  # for the losses below
    w8, scale = dl.fp8_head(weight)
    assert dl.fp8_head(weight)[0] is w8  # unchanged head: not quantized again
    assert scale.shape == (1, V) and w8.shape == weight.shape
    torch.testing.assert_close(w8.float() * scale.t(), dequant(weight))

    with torch.no_grad():
        weight[:10].mul_(3.0)  # in place (as copy_ / load_state_dict / an optimizer would)
    w8b, scale_b = dl.fp8_head(weight)
    assert w8b is not w8
    torch.testing.assert_close(w8b.float() * scale_b.t(), dequant(weight))

    other = weight.data  # same address, shape and storage, another tensor: not taken for the first
    other[:10].div_(3.0)  # through .data: the first tensor's version counter does not move
    torch.testing.assert_close(dl.fp8_head(other)[0].float() * dl.fp8_head(other)[1].t(), dequant(other))

    inputs = _inputs(seed=2, **small)
    fresh = inputs[2].clone()
    loss_a = fused(*inputs, teacher_fp8=True, **KW)[0]
    with torch.no_grad():
        inputs[2].mul_(0.5)
        fresh.mul_(0.5)
    loss_b = fused(*inputs, teacher_fp8=True, **KW)[0]
    loss_fresh = fused(*inputs[:2], fresh, *inputs[3:], teacher_fp8=True, **KW)[0]
    assert loss_b != loss_a and close(loss_b, loss_fresh, 1e-6)  # the changed head, not the cached one

    dl.fp8_head(fresh)
    assert len(dl._fp8_heads) == 1  # one head held at a time
    del fresh
    gc.collect()
    assert len(dl._fp8_heads) == 0  # its FP8 copy goes with it


@needs_fp8
def test_fp8_off_paths():
    inputs = _inputs(n=19, v=528, d=32)
    dl.clear_fp8_heads()
    ce_only = dict(temperature=1.0, kl_weight=0.0)
    a = fused(*inputs, teacher_fp8=True, **ce_only)
    b = fused(*inputs, teacher_fp8=False, **ce_only)
    assert a[0] == b[0] and torch.equal(a[1], b[1])
    assert len(dl._fp8_heads) == 0  # no teacher GEMM: nothing quantized
    # one_logits_gemm cannot hold an FP8 teacher: teacher_fp8 wins, and the result is the FP8 one
    c = fused(*inputs, teacher_fp8=True, one_logits_gemm=True, **KW)
    d = fused(*inputs, teacher_fp8=True, **KW)
    assert c[0] == d[0]


@pytest.mark.skipif(triton_fused_linear_distill_loss is None, reason="triton not importable")
def test_fp8_early_errors(monkeypatch):
    h_s, h_t, weight, labels, row_weights = _inputs()
    with pytest.raises(RuntimeError, match=r"hidden size 40 to be a multiple of 16.*teacher_fp8=False"):
        triton_fused_linear_distill_loss(h_s[:, :40], h_t[:, :40], weight[:, :40], labels, row_weights,
                                         teacher_fp8=True, **KW)

    def unsupported(*args, **kwargs):
        raise RuntimeError("Row-wise scaling is not supported on this device\nmore detail")

    monkeypatch.setattr(dl, "_fp8_support", {})
    monkeypatch.setattr(dl, "_fp8_heads", {})
    monkeypatch.setattr(torch, "_scaled_mm", unsupported)
    with pytest.raises(RuntimeError, match=r"teacher_fp8=True cannot run .*Row-wise scaling is not supported on "
                                           r"this device\).*use teacher_fp8=False"):
        triton_fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights, teacher_fp8=True, **KW)
    with pytest.raises(ValueError, match="Triton path"):
        fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights, impl="torch", teacher_fp8=True, **KW)

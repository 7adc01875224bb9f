"""The fused drafter loss against the torch reference, and the reference against first principles.

On a machine without CUDA the Triton kernel runs under ``TRITON_INTERPRET=1`` (see conftest.py),
so shapes are small and odd (the interpreter is slow and has no bf16). Several chunks and several
vocabulary blocks per row are forced so that the chunk loop and the online softmax merge are both
exercised. bf16 and real shapes are in test_distill_loss_cuda.py.
"""

import math

import pytest
import torch
from flashfleet_kernels import (
    fused_linear_distill_loss,
    reference_fused_linear_distill_loss,
    triton_fused_linear_distill_loss,
)

needs_triton = pytest.mark.skipif(triton_fused_linear_distill_loss is None, reason="triton not importable")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

N, V, D = 37, 1000, 48


def _inputs(dtype, n=N, v=V, d=D, seed=0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    h_s = torch.randn(n, d, generator=gen)
    h_t = h_s + 0.7 * torch.randn(n, d, generator=gen)
    weight = torch.randn(v, d, generator=gen) * (2.0 / math.sqrt(d))
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[[3, n // 2, n - 1]] = -100  # ignored rows, including the last one
    row_weights = torch.rand(n, generator=gen) * 2
    row_weights[[0, n // 3]] = 0.0  # zero-weight rows
    return [t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)
            for t in (h_s, h_t, weight, labels, row_weights.float())]


def _loss_and_grads(fn, h_s, h_t, weight, labels, row_weights, head_grad=False, **kw):
    h_s = h_s.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_(head_grad)
    out = fn(h_s, h_t, weight, labels, row_weights, return_row_stats=True, **kw)
    loss = out[0]
    loss.backward()
    return out, h_s.grad, weight.grad


TOL = {torch.float32: dict(atol=2e-5, rtol=2e-4), torch.float16: dict(atol=3e-3, rtol=3e-2)}


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 2.0, 1.5])  # 2.0 has a path of its own (one exp per logit)
@pytest.mark.parametrize("kl_weight", [0.0, 0.7, 1.0])
def test_triton_matches_reference(dtype, temperature, kl_weight):
    inputs = _inputs(dtype)
    kw = dict(temperature=temperature, kl_weight=kl_weight)
    (loss, ce, ok), g, _ = _loss_and_grads(triton_fused_linear_distill_loss, *inputs, chunk_size=16,
                                           block_size=256, **kw)
    (r_loss, r_ce, r_ok), r_g, _ = _loss_and_grads(reference_fused_linear_distill_loss, *inputs, **kw)
    tol = TOL[dtype]
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, r_loss.float(), **tol)
    # fp16 gradients are rounded to fp16 after scaling by w_i / sum(w): compare relative to their scale
    scale = r_g.abs().max()
    torch.testing.assert_close(g.float() / scale, r_g.float() / scale, atol=tol["atol"] * 10, rtol=0)
    torch.testing.assert_close(ce, r_ce, **tol)
    assert torch.equal(ok, r_ok)
    # rows that drop out get exactly zero gradient
    dropped = (inputs[3] == -100) | (inputs[4] == 0)
    assert torch.all(g[dropped] == 0)


@needs_triton
def test_triton_head_gradient_and_leading_dims():
    h_s, h_t, weight, labels, row_weights = _inputs(torch.float32, n=2 * 19)
    shape = (2, 19)
    kw = dict(temperature=2.0, kl_weight=0.3)
    args = (h_s.view(*shape, D), h_t.view(*shape, D), weight, labels.view(shape), row_weights.view(shape))
    (loss, _, _), g, gw = _loss_and_grads(triton_fused_linear_distill_loss, *args, head_grad=True,
                                          chunk_size=7, **kw)
    (r_loss, _, _), r_g, r_gw = _loss_and_grads(reference_fused_linear_distill_loss, *args, head_grad=True, **kw)
    assert g.shape == (*shape, D)
    torch.testing.assert_close(loss, r_loss, atol=2e-5, rtol=2e-4)
    torch.testing.assert_close(g, r_g, atol=2e-6, rtol=2e-4)
    torch.testing.assert_close(gw, r_gw, atol=2e-6, rtol=2e-4)


@needs_triton
def test_triton_single_block_and_single_chunk_defaults():
    inputs = _inputs(torch.float32, n=5, v=64, d=16)
    (loss, _, _), g, _ = _loss_and_grads(triton_fused_linear_distill_loss, *inputs, kl_weight=0.5)
    (r_loss, _, _), r_g, _ = _loss_and_grads(reference_fused_linear_distill_loss, *inputs, kl_weight=0.5)
    torch.testing.assert_close(loss, r_loss, atol=2e-5, rtol=2e-4)
    torch.testing.assert_close(g, r_g, atol=2e-6, rtol=2e-4)


@needs_triton
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_all_rows_dropped_gives_zero_not_nan(impl):
    h_s, h_t, weight, labels, row_weights = _inputs(torch.float32, n=9)
    labels[:4] = -100
    row_weights[4:] = 0.0
    h_s.requires_grad_()
    loss = fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights, kl_weight=0.5, impl=impl)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.all(h_s.grad == 0)


@needs_triton
def test_backward_scales_by_upstream_gradient_and_can_run_twice():
    h_s, h_t, weight, labels, row_weights = _inputs(torch.float32, n=11, v=300)
    h_s.requires_grad_()
    loss = triton_fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights, kl_weight=0.5)
    (g1,) = torch.autograd.grad(loss, h_s, retain_graph=True)
    (g3,) = torch.autograd.grad(3.0 * loss, h_s)
    torch.testing.assert_close(g3, 3.0 * g1)


@needs_triton
def test_teacher_gets_no_gradient_and_none_teacher_for_ce():
    h_s, h_t, weight, labels, row_weights = _inputs(torch.float32, n=8, v=200)
    h_t.requires_grad_()
    h_s.requires_grad_()
    triton_fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights, kl_weight=0.5).backward()
    assert h_t.grad is None
    ce_only = triton_fused_linear_distill_loss(h_s, None, weight, labels, row_weights)
    ref = reference_fused_linear_distill_loss(h_s, None, weight, labels, row_weights)
    torch.testing.assert_close(ce_only, ref, atol=2e-5, rtol=2e-4)
    with pytest.raises(ValueError, match="teacher_hidden"):
        fused_linear_distill_loss(h_s, None, weight, labels, row_weights, kl_weight=0.5)


def _streak_like(group, calls=None):
    """Weights from each group's own CE (a streak-weight stand-in), recording where it was called."""
    def f(ce, start, end):
        assert start % group == 0 and end % group == 0 and ce.shape == (end - start,)
        assert ce.dtype == torch.float32 and not ce.requires_grad
        s = 0.5 * torch.exp(-ce.view(-1, group)) + 0.5
        w = torch.cumprod(s, 1).flip(1).cumsum(1).flip(1).reshape(-1)
        if calls is not None:
            calls.append((start, end, w.clone()))
        return w
    return f


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("temperature, kl_weight", [(2.0, 0.7), (1.0, 0.0), (1.0, 1.0)])
def test_weight_function_matches_reference_and_tensor_weights(dtype, temperature, kl_weight):
    """Weights computed from the loss's own CE, chunk by chunk between the kernel's two passes,
    give the reference's loss, gradient and statistics, and the same as passing those weights."""
    group = 4
    inputs = _inputs(dtype, n=36)
    kw = dict(temperature=temperature, kl_weight=kl_weight, row_group=group)
    calls = []
    (loss, ce, ok), g, _ = _loss_and_grads(triton_fused_linear_distill_loss, *inputs[:4], _streak_like(group, calls),
                                           chunk_size=10, block_size=256, **kw)
    # chunk_size 10 is rounded down to 8 rows: whole groups, 5 chunks (the last one short)
    assert [(s, e) for s, e, _ in calls] == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 36)]
    used = torch.cat([w for _, _, w in calls])
    r_calls = []
    (r_loss, r_ce, r_ok), r_g, _ = _loss_and_grads(reference_fused_linear_distill_loss, *inputs[:4],
                                                   _streak_like(group, r_calls), **kw)
    assert [(s, e) for s, e, _ in r_calls] == [(0, 36)]
    tol = TOL[dtype]
    torch.testing.assert_close(loss, r_loss.float(), **tol)
    torch.testing.assert_close(ce, r_ce, **tol)
    assert torch.equal(ok, r_ok)
    torch.testing.assert_close(used, r_calls[0][2].float(), **tol)
    scale = r_g.abs().max()
    torch.testing.assert_close(g.float() / scale, r_g.float() / scale, atol=tol["atol"] * 10, rtol=0)
    # the same weights passed as a tensor: the one-launch path
    (t_loss, t_ce, _), t_g, _ = _loss_and_grads(triton_fused_linear_distill_loss, *inputs[:4], used,
                                                chunk_size=10, block_size=256, **kw)
    torch.testing.assert_close(loss, t_loss, **tol)
    torch.testing.assert_close(ce, t_ce, **tol)
    torch.testing.assert_close(g.float() / scale, t_g.float() / scale, atol=tol["atol"] * 10, rtol=0)
    dropped = inputs[3] == -100
    assert torch.all(g[dropped] == 0)


@needs_triton
def test_weight_function_head_gradient_and_backward_scaling():
    h_s, h_t, weight, labels, _ = _inputs(torch.float32, n=24, v=300)
    kw = dict(temperature=2.0, kl_weight=0.3, row_group=6)
    (loss, _, _), g, gw = _loss_and_grads(triton_fused_linear_distill_loss, h_s, h_t, weight, labels,
                                          _streak_like(6), head_grad=True, chunk_size=12, **kw)
    (r_loss, _, _), r_g, r_gw = _loss_and_grads(reference_fused_linear_distill_loss, h_s, h_t, weight, labels,
                                                _streak_like(6), head_grad=True, **kw)
    torch.testing.assert_close(loss, r_loss, atol=2e-5, rtol=2e-4)
    torch.testing.assert_close(g, r_g, atol=2e-6, rtol=2e-4)
    torch.testing.assert_close(gw, r_gw, atol=2e-6, rtol=2e-4)
    hs = h_s.clone().requires_grad_()
    loss = triton_fused_linear_distill_loss(hs, h_t, weight, labels, _streak_like(6), **kw)
    (g1,) = torch.autograd.grad(loss, hs, retain_graph=True)
    (g3,) = torch.autograd.grad(3.0 * loss, hs)
    torch.testing.assert_close(g3, 3.0 * g1)


@needs_triton
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_weight_function_edge_cases(impl):
    h_s, h_t, weight, labels, _ = _inputs(torch.float32, n=8, v=200)
    h_s.requires_grad_()
    labels[:] = -100  # every row dropped: 0, not NaN
    loss = fused_linear_distill_loss(h_s, h_t, weight, labels, _streak_like(4), kl_weight=0.5, row_group=4,
                                     impl=impl)
    loss.backward()
    assert loss.item() == 0.0 and torch.all(h_s.grad == 0)
    with pytest.raises(ValueError, match="row_group"):  # 8 rows are not whole groups of 3
        fused_linear_distill_loss(h_s, h_t, weight, labels, _streak_like(3), kl_weight=0.5, row_group=3, impl=impl)


def test_dispatch():
    h_s, h_t, weight, labels, row_weights = _inputs(torch.float32, n=6, v=50, d=8, device="cpu")
    ref = reference_fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights, kl_weight=0.2)
    # on CPU "auto" is the reference, bit for bit
    auto = fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights, kl_weight=0.2)
    assert torch.equal(auto, ref)
    forced = fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights, kl_weight=0.2, impl="torch")
    assert torch.equal(forced, ref)
    with pytest.raises(ValueError, match="impl"):
        fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights, impl="cuda")


OTHER_FOLDER_TEST = """
import os
import triton

def test_other_folder_compiles_normally():
    assert os.environ.get("TRITON_INTERPRET") is None

    @triton.jit
    def k(x):
        pass

    assert type(k) is triton.runtime.JITFunction
"""


@needs_triton
def test_interpreter_mode_does_not_leak(tmp_path):
    """A test in another folder, collected after this one, must see Triton in its normal mode."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.kernels import conftest

    if conftest.HAS_CUDA or conftest._ORIGINAL is not None:
        pytest.skip("only meaningful where conftest.py turns the interpreter on")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as outside this folder
    (tmp_path / "test_other.py").write_text(OTHER_FOLDER_TEST)
    here = Path(__file__).resolve()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(here.parents[2]),
           f"{here}::test_dispatch", str(tmp_path / "test_other.py")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 passed" in res.stdout


# --- the reference against first principles (fp64) -------------------------------------------------


def _tiny64(seed=1):
    gen = torch.Generator().manual_seed(seed)
    n, v, d = 5, 7, 3
    h_s = torch.randn(n, d, generator=gen, dtype=torch.float64)
    h_t = torch.randn(n, d, generator=gen, dtype=torch.float64)
    weight = torch.randn(v, d, generator=gen, dtype=torch.float64)
    labels = torch.tensor([0, 6, -100, 3, 2])
    row_weights = torch.tensor([0.5, 2.0, 1.0, 0.0, 1.5], dtype=torch.float64)
    return h_s, h_t, weight, labels, row_weights


@pytest.mark.parametrize("temperature, kl_weight", [(1.0, 0.0), (2.0, 0.7), (0.5, 1.0)])
def test_reference_gradcheck_fp64(temperature, kl_weight):
    h_s, h_t, weight, labels, row_weights = _tiny64()
    h_s.requires_grad_()

    def f(hs):
        return reference_fused_linear_distill_loss(hs, h_t, weight, labels, row_weights,
                                                   temperature=temperature, kl_weight=kl_weight)
    assert torch.autograd.gradcheck(f, (h_s,), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_reference_head_gradcheck_fp64_ce():
    h_s, _, weight, labels, row_weights = _tiny64()
    weight.requires_grad_()

    def f(w):
        return reference_fused_linear_distill_loss(h_s, None, w, labels, row_weights)
    assert torch.autograd.gradcheck(f, (weight,), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_reference_matches_hand_written_loop_fp64():
    """The definition in docs/kernels.md, row by row with math.exp/log."""
    h_s, h_t, weight, labels, row_weights = _tiny64()
    T, a = 2.0, 0.7
    num = den = 0.0
    for i in range(h_s.shape[0]):
        if labels[i] == -100 or row_weights[i] == 0:
            continue
        zs = [float(h_s[i] @ weight[j]) for j in range(weight.shape[0])]
        zt = [float(h_t[i] @ weight[j]) for j in range(weight.shape[0])]
        lse = math.log(sum(math.exp(z) for z in zs))
        ce = lse - zs[int(labels[i])]
        lse_sT = math.log(sum(math.exp(z / T) for z in zs))
        lse_tT = math.log(sum(math.exp(z / T) for z in zt))
        kl = sum(math.exp(t / T - lse_tT) * ((t / T - lse_tT) - (s / T - lse_sT)) for s, t in zip(zs, zt, strict=True))
        num += float(row_weights[i]) * (a * T * T * kl + (1 - a) * ce)
        den += float(row_weights[i])
    ref = reference_fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights, temperature=T, kl_weight=a)
    assert ref.dtype == torch.float64
    assert abs(ref.item() - num / den) < 1e-12


@needs_triton
@pytest.mark.parametrize("kl_weight", [0.7, 0.0])
def test_one_logits_gemm_matches_reference(kl_weight):
    """Student and teacher logits from one GEMM over a staging buffer (full chunks; the short last
    chunk takes two GEMMs) give the reference's loss and gradient; without KL there is one GEMM anyway."""
    inputs = _inputs(torch.float32)
    kw = dict(temperature=2.0, kl_weight=kl_weight)
    (loss, ce, _), g, _ = _loss_and_grads(triton_fused_linear_distill_loss, *inputs, chunk_size=16,
                                          block_size=256, one_logits_gemm=True, **kw)
    (r_loss, r_ce, _), r_g, _ = _loss_and_grads(reference_fused_linear_distill_loss, *inputs, **kw)
    torch.testing.assert_close(loss, r_loss, atol=2e-5, rtol=2e-4)
    torch.testing.assert_close(ce, r_ce, atol=2e-5, rtol=2e-4)
    torch.testing.assert_close(g, r_g, atol=2e-6, rtol=2e-4)


@needs_triton
@pytest.mark.parametrize("kl_weight", [0.0, 0.7])
def test_top_k_ids_from_the_loss_pass_match_the_reference(kl_weight):
    """DFlash 2's candidates come out of the loss's own logits: each row's top-k student logit ids,
    best first, over several chunks (the workspace is overwritten by the gradient after them), with
    the loss and its gradient unchanged by asking."""
    inputs = _inputs(torch.float32)
    kw = dict(temperature=2.0, kl_weight=kl_weight)
    (loss, ce, ok, top), g, _ = _loss_and_grads(triton_fused_linear_distill_loss, *inputs, chunk_size=16,
                                                block_size=256, top_k=5, **kw)
    (r_loss, r_ce, r_ok, r_top), r_g, _ = _loss_and_grads(reference_fused_linear_distill_loss, *inputs, top_k=5,
                                                          **kw)
    z = inputs[0] @ inputs[2].T
    assert top.shape == (N, 5) and top.dtype == torch.int64
    assert torch.equal(top, z.topk(5, dim=-1).indices) and torch.equal(r_top, top)  # every row, ignored too
    (plain, _, _), plain_g, _ = _loss_and_grads(triton_fused_linear_distill_loss, *inputs, chunk_size=16,
                                                block_size=256, **kw)
    assert torch.equal(loss, plain) and torch.equal(g, plain_g)
    torch.testing.assert_close(loss, r_loss.float(), **TOL[torch.float32])


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_triton)])
def test_top_k_return_shapes_and_refusals(impl):
    h_s, h_t, weight, labels, row_weights = _inputs(torch.float32, n=8)
    loss, top = fused_linear_distill_loss(h_s, None, weight, labels, row_weights, impl=impl, top_k=3)
    assert loss.ndim == 0 and top.shape == (8, 3)
    for bad in (-1, V + 1):
        with pytest.raises(ValueError, match="top_k must be between 0"):
            fused_linear_distill_loss(h_s, None, weight, labels, row_weights, impl=impl, top_k=bad)


@pytest.mark.parametrize("v,seg", [(1000, 64), (1024, 128), (300, 16)])
def test_top_k_ids_two_pass_equals_torch_topk(v, seg):
    """The segment-maxima top-k the fused path takes DFlash 2's candidates with: the same values as
    torch.topk, best first, also when every one of a row's top k sits in one segment, in the ragged
    last segment, or spread one per segment."""
    from flashfleet_kernels.distill_loss import top_k_ids

    k = 8
    z = torch.randn(6, v, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    z[1, 10:10 + k] += 50.0  # all in one segment
    z[2, v - 3:] += 50.0  # partly in the ragged tail
    z[3, torch.arange(k, device=DEVICE) * seg] += 50.0  # one per segment
    ids = top_k_ids(z, k, seg)
    want = z.topk(k, dim=-1)
    assert ids.shape == (6, k) and ids.dtype == torch.int64
    assert torch.equal(z.gather(1, ids), want.values) and torch.equal(ids, want.indices)


@needs_triton
@pytest.mark.parametrize("temperature, kl_weight, weights", [(1.0, 0.5, "tensor"), (2.0, 0.7, "function"),
                                                             (1.0, 1.0, "tensor")])
def test_labels_from_the_teachers_argmax_match_the_reference(temperature, kl_weight, weights):
    """The teacher's argmax as each supervised row's label, taken inside the stats pass (per segment,
    merged by the finish kernel), gives the reference's labels, loss, CE, gradient and statistics,
    and the same as passing those labels in; the caller's labels are left as they were."""
    h_s, h_t, weight, labels, row_weights = _inputs(torch.float32)
    given = labels.clone()
    w = _streak_like(1) if weights == "function" else row_weights
    kw = dict(temperature=temperature, kl_weight=kl_weight, labels_from_teacher=True)
    (loss, ce, ok, used), g, _ = _loss_and_grads(triton_fused_linear_distill_loss, h_s, h_t, weight, labels, w,
                                                 chunk_size=16, block_size=128, seg_size=256, **kw)
    (r_loss, r_ce, r_ok, r_used), r_g, _ = _loss_and_grads(reference_fused_linear_distill_loss, h_s, h_t, weight,
                                                           labels, w, **kw)
    assert torch.equal(labels, given)
    teacher = (h_t.float() @ weight.float().T).argmax(-1)
    assert torch.equal(used, torch.where(labels != -100, teacher, labels)) and torch.equal(used, r_used)
    assert not torch.equal(used, labels)  # the data's labels are not the teacher's here: the test can tell
    tol = TOL[torch.float32]
    torch.testing.assert_close(loss, r_loss.float(), **tol)
    torch.testing.assert_close(ce, r_ce, **tol)
    assert torch.equal(ok, r_ok)
    scale = r_g.abs().max()
    torch.testing.assert_close(g / scale, r_g / scale, atol=tol["atol"] * 10, rtol=0)
    (p_loss, p_ce, p_ok), p_g, _ = _loss_and_grads(triton_fused_linear_distill_loss, h_s, h_t, weight, used, w,
                                                   chunk_size=16, block_size=128, seg_size=256,
                                                   temperature=temperature, kl_weight=kl_weight)
    torch.testing.assert_close(loss, p_loss, **tol)
    torch.testing.assert_close(g / scale, p_g / scale, atol=tol["atol"] * 10, rtol=0)


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_triton)])
def test_labels_from_the_teacher_need_its_logits(impl):
    h_s, h_t, weight, labels, row_weights = _inputs(torch.float32, n=4, v=64)
    with pytest.raises(ValueError, match="labels_from_teacher .* needs kl_weight != 0"):
        fused_linear_distill_loss(h_s, h_t, weight, labels, row_weights, impl=impl, labels_from_teacher=True)

"""Vocabulary-tile skipping in the fused loss's gradient GEMM, against the full product and the reference.

Runs under the Triton interpreter without a GPU (fp32, small odd shapes, 16-row x 16-column tiles),
on the GPU as it is. The gradient wrt the logits, ``g``, is taken from the reference itself: fed
the logits as "hidden states" and the identity as "head", its gradient wrt the hidden states is
``d loss / d z``. bf16 at real shapes is in test_distill_loss_cuda.py.
"""

import math

import pytest
import torch
from flashfleet_kernels import reference_fused_linear_distill_loss, triton_fused_linear_distill_loss

needs_triton = pytest.mark.skipif(triton_fused_linear_distill_loss is None, reason="triton not importable")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

N, V, D = 37, 1000, 48
KW = dict(chunk_size=16, block_size=256)
if DEVICE == "cpu":
    KW["seg_size"] = 512


def _inputs(peaked, n=N, seed=0):
    """Flat: Gaussian logits of std ~2. Peaked: a token prior shared by all rows (rarer tokens at
    higher ids) and sharper rows, so that many (row block, tile) pairs hold almost no gradient."""
    gen = torch.Generator().manual_seed(seed)
    h_s = torch.randn(n, D, generator=gen)
    h_t = h_s + 0.5 * torch.randn(n, D, generator=gen)
    weight = torch.randn(V, D, generator=gen) * (2.0 / math.sqrt(D))
    if peaked:
        h_s, h_t = 2 * h_s, 2 * h_t
        h_s[:, 0] = h_t[:, 0] = 8.0  # the prior's coordinate; head rows of similar norms
        weight[:, 0] = -0.75 * torch.log1p(torch.arange(V, dtype=torch.float32) / 8)
    labels = torch.randint(0, 40, (n,), generator=gen)
    labels[[3, n - 1]] = -100
    row_weights = torch.rand(n, generator=gen) + 0.5
    row_weights[n // 3] = 0.0
    return [t.to(DEVICE) for t in (h_s, h_t, weight, labels, row_weights)]


def _fused(inputs, skip_mass, **kw):
    h_s = inputs[0].clone().requires_grad_()
    rep = {}
    loss, ce, ok = triton_fused_linear_distill_loss(h_s, *inputs[1:], skip_tiles=True, skip_mass=skip_mass,
                                                    skip_report=rep, return_row_stats=True, **KW, **kw)
    loss.backward()
    return loss.detach(), ce, ok, h_s.grad, rep


def _logit_grad(inputs, **kw):
    """d loss / d z_s [N, V] from the reference (fp64), and the reference's d loss / d h_s."""
    h_s, h_t, weight, labels, row_weights = (t.double() if t.is_floating_point() else t for t in inputs)
    eye = torch.eye(V, dtype=torch.float64, device=h_s.device)
    z = (h_s @ weight.T).requires_grad_()
    loss = reference_fused_linear_distill_loss(z, h_t @ weight.T, eye, labels, row_weights, **kw)
    (g,) = torch.autograd.grad(loss, z)
    return g, g @ weight


@needs_triton
@pytest.mark.parametrize("temperature, kl_weight", [(2.0, 0.7), (1.0, 0.0), (1.0, 1.0)])
@pytest.mark.parametrize("tau", [2.0**-10, 2.0**-16])
def test_peaked_teacher_skips_tiles_within_the_bound(temperature, kl_weight, tau):
    """The default bound (2^-10, below bf16's rounding of the gradient) keeps the gradient within the
    bf16 path's tolerance of the reference; 2^-16 keeps it within the fp32 path's own tolerance."""
    kw = dict(temperature=temperature, kl_weight=kl_weight)
    inputs = _inputs(peaked=True)
    loss, ce, ok, grad, rep = _fused(inputs, tau, skip_min=0.0, **kw)
    full_loss, full_ce, full_ok, full_grad, full_rep = _fused(inputs, 0.0, **kw)
    g, ref_grad = _logit_grad(inputs, **kw)

    assert rep["pairs_skipped"] > 0 and rep["chunks_skipping"] > 0  # something was left out
    assert full_rep["pairs_skipped"] == 0 and full_rep["pairs"] == 0
    # forward and its statistics do not depend on skipping
    assert torch.equal(loss, full_loss) and torch.equal(ce, full_ce) and torch.equal(ok, full_ok)
    assert 0 < rep["max_row_fraction"].item() <= tau
    assert 0 < rep["mass_fraction"].item() <= rep["max_row_fraction"].item()
    # each row's error within the bound: tau * ||g_i||_1 * max_v ||W_v||
    w_norm = inputs[2].double().norm(dim=1).max()
    err = (grad.double() - ref_grad).norm(dim=1)
    bound = tau * g.abs().sum(1) * w_norm
    assert torch.all(err <= bound + 1e-7), (err - bound).max()
    if tau <= 2.0**-16:  # the fp32 path's tolerance (test_distill_loss.py)
        scale = ref_grad.abs().max()
        torch.testing.assert_close(grad.double() / scale, ref_grad / scale, atol=2e-4, rtol=0)
    else:  # the bf16 path's tolerance at real shapes (test_distill_loss_cuda.py), with room to spare
        assert (grad.double() - ref_grad).norm() / ref_grad.norm() < 3e-3


@needs_triton
def test_skipping_gemm_computes_exactly_the_kept_tiles(monkeypatch):
    """With a large bound (many tiles skipped, a visible error), the gradient is exactly ``(g * kept) W``
    for the tiles the plan kept, and each row loses the share of its L1 mass that was reported."""
    from flashfleet_kernels import distill_loss as dl

    plans = []

    def recording_plan(mass, rows, block_rows, skip_mass, worth=None):
        out = real_plan(mass, rows, block_rows, skip_mass, worth)
        assert out[0] is not None  # skip_min=0: every chunk with a skippable pair takes the skipping GEMM
        plans.append((rows, block_rows, mass.shape[1], *out))
        return out

    real_plan = dl.skip_plan
    monkeypatch.setattr(dl, "skip_plan", recording_plan)
    kw = dict(temperature=2.0, kl_weight=0.7)
    inputs = _inputs(peaked=True)
    tau = 0.05
    _, _, _, grad, rep = _fused(inputs, tau, skip_min=0.0, **kw)
    g, ref_grad = _logit_grad(inputs, **kw)

    keep = torch.zeros(N, V, dtype=torch.bool, device=g.device)
    shares, start = [], 0
    for rows, bm, n_tiles, kept, count, row_skipped, _ in plans:
        tile = 16 if DEVICE == "cpu" else dl.SKIP_GEMM[1]
        assert -(-V // tile) == n_tiles
        for r in range(rows):
            for j in kept[r // bm, : count[r // bm]].tolist():
                keep[start + r, j * tile:(j + 1) * tile] = True
        shares.append(row_skipped)
        start += rows
    assert start == N
    expected = (g * keep) @ inputs[2].double()
    scale = expected.abs().max()
    torch.testing.assert_close(grad.double() / scale, expected / scale, atol=2e-5, rtol=0)
    # the reported shares are what was really left out of each row's L1 mass
    skipped = (g.abs() * ~keep).sum(1) / g.abs().sum(1).clamp_min(1e-300)
    torch.testing.assert_close(torch.cat(shares).double(), skipped, atol=1e-5, rtol=1e-3)
    assert skipped.max() <= tau * (1 + 1e-4)
    assert rep["max_row_fraction"].item() == pytest.approx(skipped.max().item(), rel=1e-3, abs=1e-6)
    # enough was skipped that the error is visible: the test above is not vacuous
    assert (grad.double() - ref_grad).norm() / ref_grad.norm() > 1e-3


@needs_triton
@pytest.mark.parametrize("temperature, kl_weight", [(2.0, 0.7), (1.0, 0.0)])
def test_flat_teacher_skips_nothing(temperature, kl_weight):
    kw = dict(temperature=temperature, kl_weight=kl_weight)
    inputs = _inputs(peaked=False)
    _, _, _, grad, rep = _fused(inputs, None, skip_min=0.0, **kw)  # the default bound
    _, _, _, full_grad, _ = _fused(inputs, 0.0, **kw)
    assert rep["pairs"] > 0 and rep["pairs_skipped"] == 0
    assert rep["max_row_fraction"].item() == 0.0
    assert torch.equal(grad, full_grad)


def test_skip_plan_takes_the_cheapest_tiles_within_the_budget():
    from flashfleet_kernels.distill_loss import skip_plan

    # two row blocks of two rows, five tiles; the last row is past `rows` (ignored)
    mass = torch.tensor([[0.5, 0.001, 0.002, 0.3, 0.197],
                         [0.6, 0.004, 0.001, 0.2, 0.195],
                         [0.0, 0.0, 0.0, 0.0, 0.0],
                         [9.0, 9.0, 9.0, 9.0, 9.0]])
    kept, count, row_skipped, row_total = skip_plan(mass.clone(), 3, 2, 0.005)
    # block 0: tile costs (largest share in a row) 0.5/.6, .004, .002, .3, .197: tiles 2 (.002) then 1
    # (.004) would sum to .006 > .005, so only tile 2 goes
    assert count.tolist() == [4, 0]
    assert kept[0, :4].tolist() == [0, 1, 3, 4]
    torch.testing.assert_close(row_skipped[:2], torch.tensor([0.002, 0.001]))
    # block 1 holds an all-zero row only: every tile is free to skip, and nothing is lost
    assert row_skipped[2].item() == 0.0
    torch.testing.assert_close(row_total, torch.tensor([1.0, 1.0, 0.0]))
    kept, count, row_skipped, _ = skip_plan(mass.clone(), 3, 2, 0.0)
    assert count.tolist() == [5, 0] and row_skipped.max().item() == 0.0
    # asked whether the plan is worth it: 1 + 5 of 10 pairs skippable at 0.005
    asked = []
    out = skip_plan(mass.clone(), 3, 2, 0.005, lambda skipped, pairs: asked.append((skipped, pairs)) or False)
    assert asked == [(6, 10)] and out[0] is None and out[3].tolist() == [1.0, 1.0, 0.0]


@needs_triton
def test_skipping_is_off_by_default():
    inputs = _inputs(peaked=True)
    rep = {}
    h_s = inputs[0].clone().requires_grad_()
    triton_fused_linear_distill_loss(h_s, *inputs[1:], temperature=1.0, kl_weight=0.0, skip_report=rep,
                                     **KW).backward()
    assert rep["pairs"] == 0 and rep["pairs_skipped"] == 0 and rep["max_row_fraction"].item() == 0.0


@needs_triton
def test_descriptor_variant_of_the_skipping_gemm():
    """The tensor-descriptor (TMA) variant that ``bench --skip-gemm`` times: exactly the kept tiles,
    ragged edges (rows, vocabulary) read as zeros."""
    tensor_descriptor = pytest.importorskip("triton.tools.tensor_descriptor")
    from flashfleet_kernels import distill_loss as dl

    if DEVICE == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor descriptors need a Hopper GPU or later")
    gen = torch.Generator().manual_seed(1)
    rows, v, d, bm, tile, bn, split = 40, 200, 48, 16, 16, 16, 2
    g = torch.randn(rows, v, generator=gen)
    w = torch.randn(v, d, generator=gen)
    n_tiles, blocks = -(-v // tile), -(-rows // bm)
    keep = torch.rand(blocks, n_tiles, generator=gen) > 0.4
    ranks = torch.arange(n_tiles)
    kept = torch.where(keep, ranks, ranks + n_tiles).sort(1).values.to(torch.int32)
    count = keep.sum(1).to(torch.int32)
    mask = torch.zeros(rows, v, dtype=torch.bool)
    for r in range(rows):
        for j in kept[r // bm, : count[r // bm]].tolist():
            mask[r, j * tile:(j + 1) * tile] = True
    expected = (g.double() * mask) @ w.double()
    g, w, kept, count = (t.to(DEVICE) for t in (g, w, kept, count))
    part = torch.empty(split, rows, d, device=DEVICE)
    desc = tensor_descriptor.TensorDescriptor.from_tensor
    grid = (split * blocks * -(-d // bn),)
    dl._skip_grad_gemm_tma_kernel[grid](desc(g, [bm, tile]), desc(w, [tile, bn]), part, kept, count, rows, d,
                                        n_tiles, SPLIT=split, BM=bm, BN=bn, TILE=tile)
    # fp32 inputs: TF32 on a GPU, exact under the interpreter
    tol = 2e-2 if DEVICE == "cuda" else 1e-4
    torch.testing.assert_close(part.sum(0).double().cpu(), expected, atol=tol * expected.abs().max().item(), rtol=0)

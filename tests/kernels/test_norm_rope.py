"""flashfleet_kernels.norm_rope: per-head RMSNorm and RoPE written into attention's padded layout,
forward and backward, against the trainer's torch ops (`drafter.rms_norm`, `drafter._apply_rope`) in
fp64 followed by the placement done with torch. Without a GPU the kernels run under Triton's
interpreter (conftest.py), which has no bf16: fp32 only there."""

import pytest
import torch
from flashfleet_kernels.norm_rope import norm_rope
from flashfleet_trainer.drafter import _apply_rope, rms_norm, rope

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
cuda = pytest.mark.skipif(not HAS_CUDA, reason="CUDA: bf16, which Triton's interpreter lacks")
EPS = 1e-6


def oracle(x, weight, cos, sin, *, parts, normed, length, split, shift):
    """The op by the trainer's torch ops, in x's dtype: norm and rotate the first `normed` heads,
    then place row r at r (r < split) or r + shift in zeros [length, heads, d]."""
    rows, heads, d = x.shape
    head = _apply_rope(rms_norm(x[:, :normed], weight, EPS).transpose(0, 1), cos, sin).transpose(0, 1)
    y = torch.cat([head, x[:, normed:]], dim=1)
    out = x.new_zeros(length, heads, d)
    out[:split] = y[:split]
    out[split + shift: shift + rows] = y[split:]
    return out.transpose(0, 1).split(parts)


def _inputs(rows, heads, d, dtype, g, strided=False):
    width = 2 * heads * d if strided else heads * d  # strided: the heads are a column slice of a wider row
    x = (3 * torch.randn(rows, width, device=DEV, generator=g)).to(dtype)
    x = x[:, :heads * d].view(rows, heads, d) if strided else x.view(rows, heads, d)
    weight = 1 + 0.5 * torch.randn(d, device=DEV, generator=g)
    cos, sin = rope(torch.randint(0, 40_000, (rows,), device=DEV, generator=g), d, 1e6)
    return x.detach().requires_grad_(), weight.requires_grad_(), cos, sin


# (rows, parts, normed, d, length, split, shift): q padded at the end (split = rows); K and V of the
# context and the block rows, the block rows moved to a tile boundary; rows that are not a multiple
# of the kernel's block; V alone (no normed head); one row
CASES = [(40, (4,), 4, 64, 64, 40, 0), (37, (2, 2), 2, 128, 80, 21, 11), (19, (3,), 0, 32, 19, 0, 0),
         (1, (1, 1), 1, 16, 5, 1, 3), (50, (2, 2), 2, 64, 128, 50, 0)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=cuda), torch.float32])
@pytest.mark.parametrize("strided", [False, True])
def test_matches_the_trainer_ops_in_fp64(case, dtype, strided):
    rows, parts, normed, d, length, split, shift = case
    kw = dict(parts=parts, normed=normed, length=length, split=split, shift=shift)
    g = torch.Generator(device=DEV).manual_seed(rows)
    x, weight, cos, sin = _inputs(rows, sum(parts), d, dtype, g, strided)
    outs = norm_rope(x, weight, cos, sin, EPS, **kw)
    dys = [torch.randn(o.shape, device=DEV, generator=g).to(dtype) for o in outs]
    torch.autograd.backward(outs, dys)
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    refs = oracle(x64, w64, cos.double(), sin.double(), **kw)
    torch.autograd.backward(refs, [dy.double() for dy in dys])
    # fp32 math rounded once: within one rounding of the output dtype of the exact values
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    for out, ref in zip(outs, refs, strict=True):
        assert out.dtype == dtype and out.shape == ref.shape
        torch.testing.assert_close(out.double(), ref, **tol)
    torch.testing.assert_close(x.grad.double(), x64.grad, **tol)
    if normed:
        torch.testing.assert_close(weight.grad.double(), w64.grad, rtol=1e-3 if dtype == torch.float32 else 2e-2,
                                   atol=1e-3 * rows if dtype == torch.float32 else 2e-2 * rows)
    else:  # no normed head: the weight gets no gradient (not an unwritten buffer's sum)
        assert weight.grad is None


def test_the_rows_it_does_not_reach_are_zero_and_the_output_is_row_major():
    g = torch.Generator(device=DEV).manual_seed(0)
    x, weight, cos, sin = _inputs(30, 4, 32, torch.float32, g)
    k, v = norm_rope(x, weight, cos, sin, EPS, parts=(2, 2), normed=2, length=64, split=10, shift=6)
    for part in (k, v):
        assert part.shape == (2, 64, 32) and part.stride() == (32, 4 * 32, 1)  # [length, heads, d] in memory
        assert part[:, 10:16].abs().sum() == 0 and part[:, 36:].abs().sum() == 0
        assert part[:, :10].abs().sum() > 0 and part[:, 16:36].abs().sum() > 0
    torch.testing.assert_close(v[:, 16:36], x[10:, 2:].detach().transpose(0, 1))  # V copied as it is


def test_a_part_without_gradient_counts_as_zero():
    g = torch.Generator(device=DEV).manual_seed(1)
    x, weight, cos, sin = _inputs(20, 2, 16, torch.float32, g)
    k, _ = norm_rope(x, weight, cos, sin, EPS, parts=(1, 1), normed=1, length=20, split=20)
    k.sum().backward()
    assert x.grad[:, 1].abs().sum() == 0 and x.grad[:, 0].abs().sum() > 0


def test_gradients_of_any_layout():
    """The outputs' gradients as the attention hands them back: any strides, the head dim too."""
    g = torch.Generator(device=DEV).manual_seed(3)
    x, weight, cos, sin = _inputs(24, 4, 32, torch.float32, g)
    kw = dict(parts=(2, 2), normed=2, length=40, split=9, shift=7)
    outs = norm_rope(x, weight, cos, sin, EPS, **kw)
    dys = [torch.randn(32, 40, 2, device=DEV, generator=g).permute(2, 1, 0) for _ in outs]  # d strided
    assert dys[0].stride(2) != 1
    torch.autograd.backward(outs, dys)
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    torch.autograd.backward(oracle(x64, w64, cos.double(), sin.double(), **kw), [dy.double() for dy in dys])
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(weight.grad.double(), w64.grad, rtol=1e-3, atol=1e-2)


def test_bad_input_is_refused_with_the_fix(monkeypatch):
    g = torch.Generator(device=DEV).manual_seed(2)
    x, weight, cos, sin = _inputs(8, 2, 16, torch.float32, g)
    with pytest.raises(ValueError, match="parts that split the 2 heads"):
        norm_rope(x, weight, cos, sin, EPS, parts=(1,), normed=1, length=8, split=8)
    with pytest.raises(ValueError, match="one or two parts"):
        norm_rope(x, weight, cos, sin, EPS, parts=(1, 1, 0), normed=1, length=8, split=8)
    with pytest.raises(ValueError, match="length >= rows \\+ shift"):
        norm_rope(x, weight, cos, sin, EPS, parts=(2,), normed=2, length=9, split=4, shift=2)
    with pytest.raises(ValueError, match="power of 2"):
        norm_rope(x[..., :12], weight[:12], cos[:, :12], sin[:, :12], EPS, parts=(2,), normed=2, length=8, split=8)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a CPU tensor where Triton compiles for the GPU
    with pytest.raises(ValueError, match="CUDA tensor"):
        norm_rope(x.detach().cpu(), weight.detach().cpu(), cos.cpu(), sin.cpu(), EPS, parts=(2,), normed=2,
                  length=8, split=8)


def test_the_drafter_gives_the_same_outputs_and_gradients_with_the_kernel(monkeypatch):
    """The drafter's flex path with its norms, RoPE and placement in this kernel (`_flex_placed`,
    what CUDA runs) against the same path op by op, in fp32 (here on CPU under the interpreter)."""
    np = pytest.importorskip("numpy")
    from flashfleet_trainer import attention
    from flashfleet_trainer import drafter as m
    from flashfleet_trainer.data import build_blocks, sample_anchors

    if not attention.flex_available():
        pytest.skip("this torch has no flex_attention")
    cfg = m.DrafterConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, num_hidden_layers=2, target_layer_ids=[1, 2], block_size=4,
                          mask_token_id=99, vocab_size=100, layer_types=["sliding_attention", "full_attention"],
                          sliding_window=24)
    torch.manual_seed(0)
    drafter = m.DFlashDrafter(cfg).to(DEV)
    embed = torch.randn(100, 64, device=DEV) * 0.02
    feats = torch.randn(2, 50, 128, device=DEV)
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 99, size=50) for _ in range(2)]
    masks = [np.ones(50, dtype=np.int64)] * 2
    blocks = build_blocks(tokens, masks, sample_anchors(masks, 9, torch.Generator().manual_seed(1)), 4, 99)

    # The attention of both runs: the flex path's masks, dense, through SDPA in fp32 (torch's CPU
    # flex_attention has no backward), so the runs differ in the norms, RoPE and layout alone;
    # tests/unit/test_trainer_attention_cuda.py runs the trainer's bf16 flex path, this kernel in it,
    # against an fp32 dense reference.
    from torch.nn.attention.flex_attention import create_mask

    def flex_dense(q, k, v, block_mask, enable_gqa, kernel_options):
        allowed = create_mask(block_mask.mask_mod, 1, 1, q.shape[-2], k.shape[-2], device=DEV)
        allowed = allowed | ~allowed.any(-1, keepdim=True)  # padded rows: finite, and dropped anyway
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=enable_gqa)

    monkeypatch.setattr(attention, "_flex_fn", lambda device_type: flex_dense)

    def run(kernel: bool):
        monkeypatch.setattr(m.DraftAttention, "_placed_by_kernel", lambda self, x: kernel)
        drafter.zero_grad(set_to_none=True)
        out = m.drafter_hidden(drafter, embed, feats, blocks, attn_impl="flex")
        (out * torch.linspace(-1, 1, 64, device=DEV)).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in drafter.named_parameters()}

    ref_out, ref_grads = run(False)
    out, grads = run(True)
    # fp32 summed in another order: on one H200 the largest difference was 4e-7 of a tensor's largest
    # entry, as large as the compiled ops' own difference from the plain ones (fc.weight's gradient
    # reaches 137 there, so an absolute tolerance alone fails on rounding)
    close = lambda a, b, name: torch.testing.assert_close(  # noqa: E731
        a, b, rtol=1e-4, atol=1e-5 * max(float(b.abs().max()), 1.0), msg=lambda m: f"{name}: {m}")
    close(out, ref_out, "output")
    for name, ref in ref_grads.items():
        close(grads[name], ref, name)

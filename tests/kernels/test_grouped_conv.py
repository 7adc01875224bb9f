"""DFlash 2's grouped dynamic convolution kernel against the torch version (its oracle,
flashfleet_trainer.dflash2.grouped_conv): values and the three gradients, across block edges, tap
counts, partial row and channel tiles, and delta as a view of the projection the module makes.
Without CUDA the kernels run under TRITON_INTERPRET=1 (conftest.py), in fp32; bf16 runs in
test_dflash2_cuda.py."""

import pytest
import torch
from flashfleet_trainer.dflash2 import grouped_conv as torch_conv

gc = pytest.importorskip("flashfleet_kernels.grouped_conv")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(m, h, taps, group, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g)
    # the module's layout: one projection [M, 2, taps, G], each side a strided view of it
    proj = torch.randn(m, 2, taps, h // group, generator=g) * 0.5
    base = torch.randn(2, taps, h, generator=g)
    return [t.to(DEVICE).requires_grad_() for t in (x, proj, base)]


@pytest.mark.parametrize("m,h,taps,group,block", [
    (40, 48, 2, 16, 8),  # 5 blocks of 8: a partial row tile; 3 groups in one partial channel tile
    (36, 320, 2, 16, 4),  # a second channel tile, partly filled
    (24, 64, 3, 8, 8),  # three taps, groups of 8
    (16, 32, 1, 32, 4),  # one tap: no reach into earlier rows at all
    (12, 32, 4, 4, 4),  # taps = block size: the last tap acts at the block's last row only
])
def test_kernel_matches_torch_values_and_gradients(m, h, taps, group, block):
    ours, theirs = _inputs(m, h, taps, group), _inputs(m, h, taps, group)
    dy = torch.randn(m, h, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    outs = []
    for fn, (x, proj, base) in ((gc.grouped_conv, ours), (torch_conv, theirs)):
        y = fn(x, proj[:, 1], base[1], block)  # the output side: views with an offset into both
        (y * dy).sum().backward()
        outs.append(y.detach())
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-5)
    assert torch.all(ours[1].grad[:, 0] == 0)  # the other side's delta got nothing


@pytest.mark.parametrize("tiles", [
    ({"rows": 4, "cols": 32, "warps": 1}, {"rows": 4, "cols": 32, "warps": 1, "loop": 3, "stages": 2}),  # 4 programs, the last partial
    ({"rows": 8, "cols": 16, "warps": 1}, {"rows": 2, "cols": 16, "warps": 1, "loop": 1, "stages": 1}),  # a partial sum per 2 rows
])
def test_other_tiles_give_the_same_result(tiles, monkeypatch):
    """The tiles are tuning (bench_grouped_conv.py), not semantics: a backward program that walks
    several row tiles, one whose rows end mid-walk, and tiles of a few rows each agree with torch."""
    monkeypatch.setattr(gc, "FORWARD", tiles[0])
    monkeypatch.setattr(gc, "BACKWARD", tiles[1])
    test_kernel_matches_torch_values_and_gradients(40, 48, 2, 16, 8)


def test_taps_never_cross_a_block():
    """Row r's output depends on x only within its own block: a change in one block moves
    nothing outside it."""
    m, h, block = 24, 32, 8
    x, proj, base = (t.detach() for t in _inputs(m, h, 2, 16))
    y = gc.grouped_conv(x, proj[:, 0], base[0], block)
    x2 = x.clone()
    x2[8:16] += 1.0  # the second block
    y2 = gc.grouped_conv(x2, proj[:, 0], base[0], block)
    changed = (y2 != y).any(-1)
    assert changed[8:16].all() and not changed[:8].any() and not changed[16:].any()


def test_refuses_what_it_cannot_run_and_names_the_torch_version():
    x = torch.randn(8, 48)
    with pytest.raises(ValueError, match="flashfleet_trainer.dflash2.grouped_conv"):
        gc.grouped_conv(x.to(DEVICE), torch.randn(8, 2, 5).to(DEVICE), torch.randn(2, 48).to(DEVICE), 4)  # 48 / 5


@pytest.mark.skipif(DEVICE != "cuda", reason="bf16 kernels need CUDA (the interpreter has no bf16)")
def test_bf16_at_the_27b_drafter_width_against_fp32():
    """bf16 in and out, fp32 inside: within bf16 rounding of the fp32 oracle, at the Qwen3.6-27B
    drafter's width and the published taps and group size."""
    m, h, block = 512, 5120, 8
    x, proj, base = (t.detach() for t in _inputs(m, h, 2, 16))
    dy = torch.randn(m, h, device=DEVICE)
    got = [t.bfloat16().requires_grad_() for t in (x, proj)] + [base.clone().requires_grad_()]
    want = [t.clone().requires_grad_() for t in (x, proj, base)]
    y = gc.grouped_conv(got[0], got[1][:, 0], got[2][0], block)
    (y.float() * dy).sum().backward()
    y_ref = torch_conv(want[0], want[1][:, 0], want[2][0], block)
    (y_ref * dy).sum().backward()
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), y_ref, atol=0.05, rtol=0.02)
    for a, b in zip(got, want, strict=True):
        scale = b.grad.abs().max()
        torch.testing.assert_close(a.grad.float() / scale, b.grad / scale, atol=0.02, rtol=0)

"""Ten training steps of the drafter on a real GPU, the trainer's fast path against the plain one:
the per-step losses must stay together. Needs CUDA; skipped without.

    PYTHONPATH=trainer:kernels python -m pytest tests/unit/test_drafter_steps_cuda.py -m cuda

One step is what `bench_drafter` times (and `Trainer.micro_batch` does): anchors and blocks, the
drafter's forward under bf16 autocast with fp32 master weights, the soft-label loss with streak
weights, backward, clipping folded into AdamW. The shape is a small copy of the Qwen3.6-27B
drafter's: GQA heads of 128, sliding-window layers then a full one, a block of 16, and widths that
are not multiples of the GEMM tiles. The fast path (flex attention with the norm/RoPE/placement
kernel, the Triton SwiGLU, the one-GEMM projections, the fused loss, fused AdamW) and the previous
plain path (dense SDPA mask, every elementwise op one by one, the loss in torch, foreach AdamW)
start from the same weights and see the same micro-batches; each step's loss must agree within
bf16 rounding, and so must the weights after ten updates. A wrong mask, a wrong gradient or a
skipped update moves them apart within a step or two (the mutation test below shows the check can
fail).
"""

import numpy as np
import pytest
import torch
from flashfleet_trainer import drafter as drafter_mod
from flashfleet_trainer.attention import flex_available
from flashfleet_trainer.data import build_blocks, sample_anchors
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig, drafter_hidden, gather_rows
from flashfleet_trainer.loss import drafter_loss, get_loss_fn
from flashfleet_trainer.optim import adamw, clipped_step

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(not flex_available(), reason="this torch has no flex_attention")]

SEQ_LEN, SEQS, ANCHORS, BLOCK, VOCAB, HIDDEN, STEPS = 1400, 2, 64, 16, 3001, 640, 10
LR, LOSS_TOL = 1e-3, 3e-3  # the two paths' losses: within LOSS_TOL of each other, relatively


def _config():
    return DrafterConfig(hidden_size=HIDDEN, intermediate_size=1744, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=128, num_hidden_layers=3, target_layer_ids=[1, 2, 3], block_size=BLOCK,
                         mask_token_id=VOCAB - 1, vocab_size=VOCAB,
                         layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                         sliding_window=300)


def _train(path, monkeypatch, corrupt=None):
    """Per-step losses and each parameter's change over STEPS steps along `path` ("fast" or
    "plain"); `corrupt`: a step whose update goes uphill (every gradient's sign flipped)."""
    fast = path == "fast"
    monkeypatch.setattr(drafter_mod, "FUSE_ELEMENTWISE", fast)
    cfg = _config()
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg).cuda()
    w0 = {n: p.detach().clone() for n, p in drafter.named_parameters()}
    opt = adamw(drafter.parameters(), LR, 0.01, "cuda", fused=fast)
    g = torch.Generator(device="cuda").manual_seed(0)
    embed = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=g) * 0.05).bfloat16()
    head = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=g) * 0.05).bfloat16()
    feats = torch.randn(SEQS, SEQ_LEN, 3 * HIDDEN, device="cuda", generator=g).bfloat16()
    last = torch.randn(SEQS, SEQ_LEN, HIDDEN, device="cuda", generator=g).bfloat16()
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, VOCAB - 1, size=SEQ_LEN) for _ in range(SEQS)]
    masks = [np.ones(SEQ_LEN, dtype=np.int64)] * SEQS
    loss_fn, _ = get_loss_fn("triton" if fast else "torch")
    losses = []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 + step)
        blocks = build_blocks(tokens, masks, sample_anchors(masks, ANCHORS, gen), BLOCK, cfg.mask_token_id)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            student = drafter_hidden(drafter, embed, feats, blocks, attn_impl="flex" if fast else "dense")
            tpos = torch.minimum(blocks.teacher_pos, torch.tensor(SEQ_LEN - 1)).cuda()
            teacher = gather_rows(last, blocks.seq.cuda()[:, None], tpos)
            loss, _ = drafter_loss(student, teacher, head, blocks.labels.cuda(), loss_fn=loss_fn, weighting="streak",
                                   use_soft_labels=True, kl_temperature=1.0, kl_weight=0.5, host_stats=False)
        loss.backward()
        if corrupt is not None and step == corrupt:
            for p in drafter.parameters():
                p.grad.neg_()
        clipped_step(opt, 1.0)
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    return losses, {n: (p.detach() - w0[n]) for n, p in drafter.named_parameters()}


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _close(a, b):
    return abs(a - b) <= LOSS_TOL * abs(b)


def test_ten_steps_fast_path_matches_plain_path(monkeypatch):
    plain, d_plain = _train("plain", monkeypatch)
    fast, d_fast = _train("fast", monkeypatch)
    print("plain", [f"{x:.5f}" for x in plain])
    print("fast ", [f"{x:.5f}" for x in fast])
    assert plain[-1] < plain[0]  # it trains: the comparison is over moving weights
    for step, (a, b) in enumerate(zip(fast, plain, strict=True)):
        assert _close(a, b), (step, a, b)
    worst = max(d_plain, key=lambda n: _rel(d_fast[n], d_plain[n]))
    print(f"largest relative difference of a ten-step update: {worst} {_rel(d_fast[worst], d_plain[worst]):.2e}")
    # Adam's first updates are near sign(gradient): entries whose gradient is near 0 may go either
    # way by rounding, so the updates agree loosely; a wrong gradient would turn them around
    for name, ref in d_plain.items():
        assert _rel(d_fast[name], ref) < 0.3, name


def test_ten_steps_check_catches_an_uphill_step(monkeypatch):
    """The comparison above is able to fail: one uphill update (step 3) moves the later losses apart."""
    plain, _ = _train("plain", monkeypatch)
    bad, _ = _train("fast", monkeypatch, corrupt=3)
    print("plain  ", [f"{x:.5f}" for x in plain])
    print("flipped", [f"{x:.5f}" for x in bad])
    assert all(_close(a, b) for a, b in zip(bad[:4], plain[:4], strict=True))
    assert not all(_close(a, b) for a, b in zip(bad[4:], plain[4:], strict=True))

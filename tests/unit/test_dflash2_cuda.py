"""DFlash 2 on a real GPU: the trainer's fast path (flex attention, the compiled convolution and
elementwise ops, the Triton loss, fused AdamW) against the plain one (dense SDPA, every op on its
own, the loss in torch, foreach AdamW), as tests/unit/test_drafter_steps_cuda.py does for DFlash,
with the selector's loss in every step. Needs CUDA; skipped without.

    PYTHONPATH=trainer:kernels:module_utils python -m pytest tests/unit/test_dflash2_cuda.py -m cuda
"""

import numpy as np
import pytest
import torch
from flashfleet_trainer import drafter as drafter_mod
from flashfleet_trainer.attention import flex_available
from flashfleet_trainer.data import build_blocks, sample_anchors
from flashfleet_trainer.dflash2 import grouped_conv, selector_loss
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig, drafter_hidden
from flashfleet_trainer.loss import drafter_loss, get_loss_fn
from flashfleet_trainer.optim import adamw, clipped_step

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(not flex_available(), reason="this torch has no flex_attention")]

SEQ_LEN, SEQS, ANCHORS, BLOCK, VOCAB, HIDDEN, STEPS = 1400, 2, 64, 16, 3001, 640, 8
LR, LOSS_TOL = 1e-3, 1e-2


def _config():
    return DrafterConfig(hidden_size=HIDDEN, intermediate_size=1744, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=128, num_hidden_layers=3, target_layer_ids=[1, 2, 3], block_size=BLOCK,
                         mask_token_id=VOCAB - 1, vocab_size=VOCAB, drafter_kind="dflash2", selector_rank=64,
                         layer_types=["sliding_attention", "sliding_attention", "full_attention"], sliding_window=300)


def test_the_compiled_convolution_is_the_eager_one(monkeypatch):
    """bf16, as training runs it: forward and the input's and kernels' gradients, eager and compiled,
    each against the same function in float64 (the oracle). Eager rounds every intermediate to bf16
    and the compiled kernel keeps them in fp32, so the two differ by bf16 ulps (up to 0.0625 in 50 of
    a million elements on an H100); what must hold is that the compiled one is no further from the
    oracle than bf16 eager is, norm-wise, and close to it."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(96 * BLOCK, HIDDEN, device="cuda", generator=g).bfloat16().requires_grad_()
    delta = torch.randn(96 * BLOCK, 2, HIDDEN // 16, device="cuda", generator=g).bfloat16().requires_grad_()
    base = torch.randn(2, HIDDEN, device="cuda", generator=g).requires_grad_()

    def run(fn, *args):
        y = fn(*args, BLOCK)
        return (y.double(), *(d.double() for d in torch.autograd.grad(y.double().square().sum(), args)))

    oracle = run(grouped_conv, *(t.detach().double().requires_grad_() for t in (x, delta, base)))
    results = []
    for fuse in (False, True):
        monkeypatch.setattr(drafter_mod, "FUSE_ELEMENTWISE", fuse)
        results.append(run(drafter_mod._fused(grouped_conv, x), x, delta, base))
    assert drafter_mod._fused(grouped_conv, x) is not grouped_conv  # the compiled one was tried
    for name, ref, eager, compiled in zip(("y", "dx", "ddelta", "dbase"), oracle, *results, strict=True):
        err_eager = ((eager - ref).norm() / ref.norm()).item()
        err_compiled = ((compiled - ref).norm() / ref.norm()).item()
        assert err_compiled < 1e-2 and err_compiled <= 2 * err_eager + 1e-4, (name, err_compiled, err_eager)


def _train(fast: bool, monkeypatch):
    monkeypatch.setattr(drafter_mod, "FUSE_ELEMENTWISE", fast)
    cfg = _config()
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg).cuda()
    opt = adamw(drafter.parameters(), LR, 0.01, "cuda", fused=fast)
    g = torch.Generator(device="cuda").manual_seed(0)
    embed = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=g) * 0.05).bfloat16()
    head = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=g) * 0.05).bfloat16()
    feats = torch.randn(SEQS, SEQ_LEN, 3 * HIDDEN, device="cuda", generator=g).bfloat16()
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, VOCAB - 1, size=SEQ_LEN) for _ in range(SEQS)]
    masks = [np.ones(SEQ_LEN, dtype=np.int64)] * SEQS
    loss_fn, _ = get_loss_fn("triton" if fast else "torch")
    losses, selector = [], []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 + step)
        blocks = build_blocks(tokens, masks, sample_anchors(masks, ANCHORS, gen), BLOCK, cfg.mask_token_id)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            student = drafter_hidden(drafter, embed, feats, blocks, attn_impl="flex" if fast else "dense")
            loss, st = drafter_loss(student, None, head, blocks.labels.cuda(), loss_fn=loss_fn, weighting="streak",
                                    host_stats=False, top_k=drafter.candidates_k)
            sel, _ = selector_loss(drafter.selector, student[:, 1:], head, st["labels"],
                                   blocks.predecessors[:, 1:].cuda(), st["weights"][:, 1:], candidates=st["top_ids"])
            loss = loss + sel
        loss.backward()
        clipped_step(opt, 1.0)
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        selector.append(float(sel.detach()))
    conv = drafter.layers[0].attention_conv.kernel_projection.weight.detach().abs().max().item()
    return losses, selector, conv


def test_dflash2_steps_fast_path_match_plain_path(monkeypatch):
    plain, plain_sel, plain_conv = _train(False, monkeypatch)
    fast, fast_sel, fast_conv = _train(True, monkeypatch)
    print("plain", [f"{x:.4f}" for x in plain], "selector", [f"{x:.4f}" for x in plain_sel])
    print("fast ", [f"{x:.4f}" for x in fast], "selector", [f"{x:.4f}" for x in fast_sel])
    assert plain[-1] < plain[0] and plain_sel[-1] < plain_sel[0]  # both terms train
    assert plain_conv > 0 and fast_conv > 0  # the convolutions left the identity
    for step, (a, b) in enumerate(zip(fast, plain, strict=True)):
        assert abs(a - b) <= LOSS_TOL * abs(b), (step, a, b)

"""The flex attention path against the dense SDPA path on a real GPU, forward and gradients, in
the trainer's precision (fp32 master weights, bf16 autocast). Needs CUDA; skipped without.

    PYTHONPATH=trainer:kernels python -m pytest tests/unit/test_trainer_attention_cuda.py -m cuda

Both bf16 paths are compared with an fp32 dense reference: flex must be as close to it as SDPA is
(they differ only in rounding), and close to SDPA itself. Micro-batches whose shapes fall in the
same bucket must not compile flex_attention again. The compiled elementwise ops (RMSNorm, RoPE, SwiGLU)
must be as close to the fp32 reference as the same ops run one by one.
"""

import numpy as np
import pytest
import torch
from flashfleet_trainer.attention import flex_available
from flashfleet_trainer.data import build_blocks, sample_anchors
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig, drafter_hidden

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(not flex_available(), reason="this torch has no flex_attention")]

SEQ_LEN, SEQS, ANCHORS, BLOCK = 1500, 2, 96, 16


def _setup():
    cfg = DrafterConfig(hidden_size=1024, intermediate_size=2048, num_attention_heads=16, num_key_value_heads=4,
                        head_dim=128, num_hidden_layers=2, target_layer_ids=[1, 2], block_size=BLOCK,
                        mask_token_id=999, vocab_size=1000)
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg).cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    embed = (torch.randn(1000, 1024, device="cuda", generator=g) * 0.02).bfloat16()
    feats = torch.randn(SEQS, SEQ_LEN, 2 * 1024, device="cuda", generator=g).bfloat16()
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 999, size=SEQ_LEN) for _ in range(SEQS)]
    return drafter, embed, feats, tokens


def _blocks(tokens, seed):
    masks = [np.ones(SEQ_LEN, dtype=np.int64)] * SEQS
    anchors = sample_anchors(masks, ANCHORS, torch.Generator().manual_seed(seed))
    return build_blocks(tokens, masks, anchors, BLOCK, 999)


def _run(drafter, embed, feats, blocks, impl, autocast=True):
    drafter.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        out = drafter_hidden(drafter, embed, feats.float() if not autocast else feats, blocks, attn_impl=impl)
    w = torch.linspace(-1, 1, out.shape[-1], device="cuda")
    (out.float() * w).sum().backward()  # a loss whose gradient differs per feature
    return out.detach().float(), {n: p.grad.detach().float().clone() for n, p in drafter.named_parameters()}


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def test_flex_matches_dense_forward_and_gradients_in_bf16():
    drafter, embed, feats, tokens = _setup()
    blocks = _blocks(tokens, 1)
    ref_out, ref_grads = _run(drafter, embed.float(), feats, blocks, "dense", autocast=False)
    dense_out, dense_grads = _run(drafter, embed, feats, blocks, "dense")
    flex_out, flex_grads = _run(drafter, embed, feats, blocks, "flex")
    e_dense, e_flex = _rel(dense_out, ref_out), _rel(flex_out, ref_out)
    print(f"forward rel. error vs fp32: dense {e_dense:.2e}, flex {e_flex:.2e}, flex vs dense "
          f"{_rel(flex_out, dense_out):.2e}")
    assert e_flex <= 1.5 * e_dense + 2e-3
    assert _rel(flex_out, dense_out) < 2e-2
    for name, ref in ref_grads.items():
        g_dense, g_flex = _rel(dense_grads[name], ref), _rel(flex_grads[name], ref)
        print(f"grad {name}: dense {g_dense:.2e}, flex {g_flex:.2e}, flex vs dense "
              f"{_rel(flex_grads[name], dense_grads[name]):.2e}")
        assert g_flex <= 1.5 * g_dense + 5e-3, name
        assert _rel(flex_grads[name], dense_grads[name]) < 5e-2, name


def test_flex_does_not_recompile_for_micro_batches_of_the_same_bucket():
    from torch._dynamo.utils import counters

    drafter, embed, feats, tokens = _setup()
    _run(drafter, embed, feats, _blocks(tokens, 2), "flex")
    graphs = counters["stats"]["unique_graphs"]
    for seed in (3, 4, 5):  # other anchors: another context length, the same padded shapes
        out, _ = _run(drafter, embed, feats, _blocks(tokens, seed), "flex")
        assert torch.isfinite(out).all()
    assert counters["stats"]["unique_graphs"] == graphs


def test_compiled_elementwise_matches_op_by_op(monkeypatch):
    """RMSNorm, RoPE and SwiGLU compiled (`drafter._fused`, the default on CUDA) against the same ops
    run one by one: as close to the fp32 reference, forward and gradients."""
    import flashfleet_trainer.drafter as m

    drafter, embed, feats, tokens = _setup()
    blocks = _blocks(tokens, 6)
    monkeypatch.setattr(m, "_COMPILED", {})  # fresh: only this test's compiled path counts
    monkeypatch.setattr(m, "FUSE_ELEMENTWISE", False)  # the reference and the op-by-op run
    ref_out, ref_grads = _run(drafter, embed.float(), feats, blocks, "flex", autocast=False)
    eager_out, eager_grads = _run(drafter, embed, feats, blocks, "flex")
    assert not m._COMPILED
    monkeypatch.setattr(m, "FUSE_ELEMENTWISE", True)
    fused_out, fused_grads = _run(drafter, embed, feats, blocks, "flex")
    assert m.rms_norm in m._COMPILED  # the compiled path ran (and the Triton swiglu: test_swiglu.py)
    e_fused, e_eager = _rel(fused_out, ref_out), _rel(eager_out, ref_out)
    print(f"forward rel. error vs fp32: compiled {e_fused:.2e}, op by op {e_eager:.2e}")
    assert e_fused <= 1.5 * e_eager + 2e-3 and _rel(fused_out, eager_out) < 2e-2
    for name, ref in ref_grads.items():
        g_fused, g_eager = _rel(fused_grads[name], ref), _rel(eager_grads[name], ref)
        assert g_fused <= 1.5 * g_eager + 5e-3, (name, g_fused, g_eager)
        assert _rel(fused_grads[name], eager_grads[name]) < 5e-2, name

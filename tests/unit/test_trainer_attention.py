"""The flex attention path's mask, BlockMask and output against the dense reference (CPU).

The flex path must compute exactly the strict DFlash mask of `block_attention_inputs`: its
mask_mod is evaluated densely here on random micro-batches, and the BlockMask's tile lists are
checked against that dense predicate. flex_attention's forward runs on CPU (torch's unfused
reference), so the drafter's output is compared too; its backward is CUDA-only
(test_trainer_attention_cuda.py).
"""

import copy

import numpy as np
import pytest
import torch
from flashfleet_trainer.attention import (
    TILE,
    SparseAttention,
    block_attention_inputs,
    block_mask_intervals,
    bucket,
    flex_available,
    flex_layouts,
    interval_block_mask,
    interval_mask_mod,
    resolve_attn_impl,
)
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.data import build_blocks
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig, drafter_hidden
from flashfleet_trainer.errors import ConfigError
from flashfleet_trainer.trainer import Prepared

needs_flex = pytest.mark.skipif(not flex_available(), reason="this torch has no torch.nn.attention.flex_attention")


def _random_micro_batch(rng, block_size):
    """(seq [N], anchor [N]) like sample_anchors + build_blocks give: per sequence, sorted distinct
    anchors; some sequences have none; sequence lengths from a few tokens to several tiles."""
    n_seqs = int(rng.integers(1, 5))
    seq, anchor = [], []
    for s in range(n_seqs):
        length = int(rng.integers(3, 700))
        if rng.random() < 0.2 and s > 0:
            continue  # a sequence without anchors gathers no context
        k = int(rng.integers(1, min(60, length - 2) + 1))
        picks = np.sort(rng.choice(np.arange(0, length - 1), size=k, replace=False))
        seq += [s] * k
        anchor += picks.tolist()
    return torch.tensor(seq), torch.tensor(anchor)


def _dense_predicate(layout):
    """The flex mask_mod evaluated on every (row, kv) pair of the padded problem."""
    mm = interval_mask_mod(layout["lo"], layout["hi"], layout["blo"], layout["bhi"])
    q = torch.arange(layout["q_len"])[:, None]
    kv = torch.arange(layout["kv_len"])[None, :]
    return mm(0, 0, q, kv)


@pytest.mark.parametrize("block_size", [2, 4, 16])
def test_flex_mask_equals_the_dense_mask_on_random_micro_batches(block_size):
    rng = np.random.default_rng(block_size)
    for _ in range(25):
        seq, anchor = _random_micro_batch(rng, block_size)
        ctx_seq, ctx_pos, block_pos, mask = block_attention_inputs(seq, anchor, block_size)
        lay = block_mask_intervals(seq, anchor, block_size)
        assert torch.equal(lay["ctx_seq"], ctx_seq) and torch.equal(lay["ctx_pos"], ctx_pos)
        assert torch.equal(lay["block_pos"], block_pos)
        t, t_pad, m = lay["t"], lay["t_pad"], lay["m"]
        assert t == ctx_seq.shape[0] and m == seq.shape[0] * block_size
        assert t_pad % TILE == 0 and t <= t_pad < t + TILE
        assert lay["q_len"] >= m and lay["kv_len"] >= t_pad + m
        # the dense mask, laid out the way the flex path pads: context at [0, t), blocks at [t_pad, t_pad + m)
        want = torch.zeros(lay["q_len"], lay["kv_len"], dtype=torch.bool)
        want[:m, :t] = mask[:, :t]
        want[:m, t_pad:t_pad + m] = mask[:, t:]
        assert torch.equal(_dense_predicate(lay), want)


def _check_tiles(seq, anchor, window=None) -> bool:
    """The flex block mask lists exactly the tiles the dense mask touches; True if some are full."""
    lay = block_mask_intervals(seq, anchor, 16, window)
    bm = interval_block_mask(lay["lo"], lay["hi"], lay["blo"], lay["bhi"], lay["q_len"], lay["kv_len"])
    dense = _dense_predicate(lay)
    qb, kb = lay["q_len"] // TILE, lay["kv_len"] // TILE
    tiles = dense.view(qb, TILE, kb, TILE)
    touched, covered = tiles.any(3).any(1), tiles.all(3).all(1)
    listed = torch.zeros(qb, kb, dtype=torch.bool)
    full = torch.zeros(qb, kb, dtype=torch.bool)
    for i in range(qb):
        listed[i, bm.kv_indices[0, 0, i, : bm.kv_num_blocks[0, 0, i]].long()] = True
        full[i, bm.full_kv_indices[0, 0, i, : bm.full_kv_num_blocks[0, 0, i]].long()] = True
    assert not (listed & full).any()  # a tile is partial or full, not both
    assert torch.equal(listed | full, touched)  # no allowed pair is skipped, no empty tile is computed
    assert not (full & ~covered).any()  # mask_mod may be skipped only where every pair is allowed
    return bool(full.any())


@needs_flex
def test_block_mask_lists_exactly_the_tiles_the_mask_touches():
    rng = np.random.default_rng(7)
    saw_full = False
    # plus edges: a row tile whose lowest anchor ends one short of a kv tile (that tile is partial),
    # and one whose anchors all end exactly on a tile boundary (full)
    edges = [(torch.zeros(8, dtype=torch.long), torch.tensor([255, 300, 310, 320, 330, 340, 350, 360])),
             (torch.zeros(8, dtype=torch.long), torch.tensor([256, 384, 400, 410, 420, 430, 440, 450]))]
    for trial in range(17):
        seq, anchor = edges[trial] if trial < len(edges) else _random_micro_batch(rng, 16)
        saw_full |= _check_tiles(seq, anchor)
    assert saw_full  # long contexts give whole tiles below every anchor of a row tile


def _blocks(rng, lengths=(90, 200, 60), per_seq=12, block_size=4):
    xs = [rng.integers(0, 50, size=n) for n in lengths]
    anchors = [np.sort(rng.choice(np.arange(1, len(x) - 1), size=per_seq, replace=False)) for x in xs]
    return xs, anchors, build_blocks(xs, [np.ones(len(x)) for x in xs], anchors, block_size, 3)


def _dense_and_flex(drafter, embed, feats, blocks):
    """The drafter's hidden states through both attention paths (skips where flex cannot run on CPU)."""
    with torch.no_grad():
        dense = drafter_hidden(drafter, embed, feats, blocks, attn_impl="dense")
        try:
            flex = drafter_hidden(drafter, embed, feats, blocks, attn_impl="flex")
        except (NotImplementedError, RuntimeError) as e:  # pragma: no cover - depends on the torch build
            pytest.skip(f"flex_attention does not run on CPU in torch {torch.__version__}: {e}")
    return dense, flex


@needs_flex
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_forward_matches_dense_on_cpu():
    cfg = DrafterConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, num_hidden_layers=2, target_layer_ids=[0, 1], block_size=4, mask_token_id=3,
                        vocab_size=50)
    torch.manual_seed(0)
    drafter, embed = DFlashDrafter(cfg).eval(), torch.randn(50, 32)
    _, anchors, blocks = _blocks(np.random.default_rng(1))
    feats = torch.randn(3, 200, 64)
    dense, flex = _dense_and_flex(drafter, embed, feats, blocks)
    assert flex.shape == dense.shape
    assert torch.allclose(flex, dense, atol=1e-5, rtol=1e-5)
    # and it is the strict mask: a feature at an anchor of sequence 1 changes nothing for blocks there
    later = feats.clone()
    later[1, int(anchors[1][-1]):] += 5.0
    with torch.no_grad():
        again = drafter_hidden(drafter, embed, later, blocks, attn_impl="flex")
    assert torch.allclose(again, flex, atol=1e-6)


def test_activations_travel_in_the_autocast_dtype_between_layers():
    """Under bf16 autocast (training on CUDA; CPU autocast here) the residual stream, the context
    and every norm's output are bf16, so no layer casts its input again, while the master weights
    stay fp32; without autocast everything stays in the weights' dtype. The bf16 output stays close
    to the fp32 one."""
    cfg = DrafterConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, num_hidden_layers=2, target_layer_ids=[0, 1], block_size=4, mask_token_id=3,
                        vocab_size=50)
    torch.manual_seed(0)
    drafter, embed = DFlashDrafter(cfg), torch.randn(50, 32)
    _, _, blocks = _blocks(np.random.default_rng(2))
    feats = torch.randn(3, 200, 64)
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append((type(m).__name__, o.dtype)))
             for m in drafter.modules() if type(m).__name__ in ("DraftLayer", "RMSNorm")]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = drafter_hidden(drafter, embed, feats, blocks, attn_impl="dense")
    assert low.dtype == torch.bfloat16 and {d for _, d in seen} == {torch.bfloat16}, seen
    assert len(seen) == 1 + 2 * 5 + 1  # hidden_norm; per layer its 2 norms, q/k norms and itself; the final norm
    assert all(p.dtype == torch.float32 for p in drafter.parameters())
    seen.clear()
    full = drafter_hidden(drafter, embed, feats, blocks, attn_impl="dense")
    assert full.dtype == torch.float32 and {d for _, d in seen} == {torch.float32}
    for h in hooks:
        h.remove()
    assert float((low.float() - full).norm() / full.norm()) < 3e-2


def test_bucket_pads_little_and_to_whole_tiles():
    seen = set()
    for n in range(1, 40_000, 37):
        b = bucket(n)
        assert b >= n and b % TILE == 0
        assert n <= 2 * TILE or b <= 1.5 * n
        seen.add(b)
    assert len(seen) < 30  # a few compiled shapes for a whole range of micro-batch sizes


def test_attn_impl_choice_and_flag():
    assert resolve_attn_impl("auto", "cpu") == "dense"
    assert resolve_attn_impl("dense", "cuda:0") == "dense"
    assert resolve_attn_impl("auto", "cuda:0") == ("flex" if flex_available() else "dense")
    with pytest.raises(ValueError):
        resolve_attn_impl("sparse", "cpu")
    base = ["--target-model", "m", "--data-dir", "d", "--output-dir", "o"]
    assert parse_args(base).attn_impl == "auto"
    assert parse_args([*base, "--attn-impl", "dense"]).attn_impl == "dense"


def test_flex_on_a_cpu_drafter_is_a_config_error(trainer_argv):
    from flashfleet_trainer.preflight import preflight

    args = parse_args(trainer_argv("--attn-impl", "flex"))
    with pytest.raises(ConfigError, match="no backward on CPU"):
        preflight(args)
    args = parse_args(trainer_argv("--attn-impl", "auto"))
    assert any("drafter attention: dense" in line for line in preflight(args).summary)


@pytest.mark.parametrize("saver_fused,loader_fused", [(True, None), (None, True)])
def test_optimizer_state_resumes_across_fused_and_foreach(saver_fused, loader_fused):
    """A CUDA run's fused AdamW state resumes on a foreach optimizer and back (on CPU, where torch
    has both), keeping the loader's kernel, and continues exactly like an uninterrupted run."""
    from flashfleet_trainer.trainer import load_optimizer_state

    def make(fused):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(64, 8))
        return w, torch.optim.AdamW([w], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.01, fused=fused)

    def step(w, opt, i):
        opt.zero_grad()
        (w.sin() * (i + 1)).sum().backward()
        opt.step()

    w_a, opt_a = make(saver_fused)
    for i in range(3):
        step(w_a, opt_a, i)
    saved = copy.deepcopy(opt_a.state_dict())  # as read back from a checkpoint: no shared tensors
    w_b, opt_b = make(loader_fused)
    with torch.no_grad():
        w_b.copy_(w_a)
    load_optimizer_state(opt_b, saved)
    assert opt_b.param_groups[0]["fused"] == loader_fused
    for i in range(3, 5):
        step(w_a, opt_a, i)
        step(w_b, opt_b, i)
    assert torch.allclose(w_a, w_b, atol=1e-6)


# ---- sliding-window layers (DrafterConfig.layer_types / sliding_window) ---------------------------

WINDOWS = [1, 2, 3, 4, 5, 16, 17, 100, 10_000]


def _reference_mask(seq, anchor, block_size, window, causal=True):
    """The mask from its definition, one (row, key) pair at a time: a row of block j (sequence s,
    anchor a, slot k, position p = a + k) sees context of s at positions < a and its own block's
    slots; a sliding layer only keys at positions q <= p with p - q < W (the query counts), or
    with `causal` False (DFlash 2's) block keys at |p - q| < W."""
    ctx_seq, ctx_pos, _, _ = block_attention_inputs(seq, anchor, block_size)
    n, t = len(anchor), len(ctx_seq)
    want = torch.zeros(n * block_size, t + n * block_size, dtype=torch.bool)
    for j in range(n):
        s, a = int(seq[j]), int(anchor[j])
        for k in range(block_size):
            r, p = j * block_size + k, a + k
            for c in range(t):
                q = int(ctx_pos[c])
                want[r, c] = int(ctx_seq[c]) == s and q < a and (window is None or (q <= p and p - q < window))
            for k2 in range(block_size):
                q = a + k2
                want[r, t + j * block_size + k2] = window is None or ((q <= p or not causal) and abs(p - q) < window)
    return want


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, *WINDOWS])
def test_dense_sliding_mask_is_its_definition(window, causal):
    rng = np.random.default_rng(0 if window is None else window)
    for block_size in (3, 4):
        for _ in range(3):
            seq, anchor = _random_micro_batch(rng, block_size)
            keep = anchor < 120  # keep the brute force small
            seq, anchor = seq[keep], anchor[keep]
            if len(anchor) == 0:
                continue
            *_, mask = block_attention_inputs(seq, anchor, block_size, window, causal=causal)
            assert torch.equal(mask, _reference_mask(seq, anchor, block_size, window, causal))


def test_sliding_window_edges():
    """W = 1: each row sees itself only; W >= context + block: causal in the block, whole context."""
    seq, anchor = torch.tensor([0, 0]), torch.tensor([5, 9])
    *_, m1 = block_attention_inputs(seq, anchor, 4, 1)
    t = 9  # context gathered: positions 0..8 of sequence 0
    assert not m1[:, :t].any() and torch.equal(m1[:, t:], torch.eye(8, dtype=torch.bool))
    *_, full = block_attention_inputs(seq, anchor, 4)
    *_, wide = block_attention_inputs(seq, anchor, 4, 10_000)
    assert torch.equal(wide[:, :t], full[:, :t])  # the same context as a full layer
    causal = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    assert torch.equal(wide[:4, t:t + 4], causal) and torch.equal(wide[4:, t + 4:], causal)
    assert not wide[:4, t + 4:].any() and not wide[4:, t:t + 4].any()
    # W = 3 at anchor 9: slot 0 (p 9) sees context 7, 8; slot 2 (p 11) sees no context, slots 0..2
    *_, w3 = block_attention_inputs(seq, anchor, 4, 3)
    assert w3[4, :t].nonzero().flatten().tolist() == [7, 8]
    assert not w3[6, :t].any() and w3[6, t + 4:].tolist() == [True, True, True, False]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", WINDOWS)
def test_flex_sliding_intervals_equal_the_dense_sliding_mask(window, causal):
    rng = np.random.default_rng(100 + window)
    for block_size in (4, 16):
        for _ in range(12):
            seq, anchor = _random_micro_batch(rng, block_size)
            ctx_seq, ctx_pos, block_pos, mask = block_attention_inputs(seq, anchor, block_size, window, causal)
            lay = block_mask_intervals(seq, anchor, block_size, window, causal)
            full = block_mask_intervals(seq, anchor, block_size)
            for k in ("ctx_seq", "ctx_pos", "block_pos"):  # one gather for every layer kind
                assert torch.equal(lay[k], full[k])
            assert (lay["t"], lay["t_pad"], lay["q_len"], lay["kv_len"]) == \
                (full["t"], full["t_pad"], full["q_len"], full["kv_len"])
            t, t_pad, m = lay["t"], lay["t_pad"], lay["m"]
            want = torch.zeros(lay["q_len"], lay["kv_len"], dtype=torch.bool)
            want[:m, :t] = mask[:, :t]
            want[:m, t_pad:t_pad + m] = mask[:, t:]
            assert torch.equal(_dense_predicate(lay), want)


@needs_flex
@pytest.mark.parametrize("window", [1, 7, 100, 300])
def test_sliding_block_mask_lists_exactly_the_tiles_the_mask_touches(window):
    rng = np.random.default_rng(window)
    for _ in range(6):
        seq, anchor = _random_micro_batch(rng, 16)
        _check_tiles(seq, anchor, window)


def _mixed_drafter(window, layer_types=("sliding_attention", "full_attention", "sliding_attention")):
    cfg = DrafterConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, num_hidden_layers=len(layer_types), target_layer_ids=[0, 1], block_size=4,
                        mask_token_id=3, vocab_size=50, layer_types=list(layer_types), sliding_window=window)
    torch.manual_seed(0)
    return DFlashDrafter(cfg).eval(), torch.randn(50, 32)


@needs_flex
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("window", [1, 3, 9, 64])
def test_flex_forward_with_sliding_layers_matches_dense_on_cpu(window):
    drafter, embed = _mixed_drafter(window)
    _, _, blocks = _blocks(np.random.default_rng(window))
    feats = torch.randn(3, 200, 64)
    dense, flex = _dense_and_flex(drafter, embed, feats, blocks)
    assert torch.allclose(flex, dense, atol=1e-5, rtol=1e-5)
    # the window is in effect: the same drafter with all-full layers computes something else
    full, _ = _mixed_drafter(None, ("full_attention",) * 3)
    full.load_state_dict(drafter.state_dict())
    with torch.no_grad():
        unwindowed = drafter_hidden(full, embed, feats, blocks, attn_impl="dense")
    assert not torch.allclose(unwindowed, dense, atol=1e-4)


@needs_flex
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_attention_built_ahead_is_the_one_the_forward_builds():
    """Prepared.to_device builds a micro-batch's SparseAttention before its forward (the trainer
    queues it behind the previous backward); the forward given it computes what it computes when
    it builds its own, and it does use the one given."""
    drafter, embed = _mixed_drafter(3)
    _, _, blocks = _blocks(np.random.default_rng(5))
    feats = torch.randn(3, 200, 64)
    p = Prepared((0, 0), None, blocks, layouts=flex_layouts(drafter.config, blocks)).to_device("cpu")
    assert isinstance(p.layouts, SparseAttention)
    assert set(p.layouts.block_masks) == {"sliding_attention", "full_attention"}
    with torch.no_grad():
        ahead = drafter_hidden(drafter, embed, feats, blocks, attn_impl="flex", layouts=p.layouts)
        inline = drafter_hidden(drafter, embed, feats, blocks, attn_impl="flex")
        assert torch.equal(ahead, inline)
        p.layouts.block_masks["full_attention"] = p.layouts.block_masks["sliding_attention"]
        assert not torch.allclose(drafter_hidden(drafter, embed, feats, blocks, attn_impl="flex", layouts=p.layouts),
                                  inline, atol=1e-4)


def test_sliding_layers_are_causal_in_the_block_and_windowed_over_the_context():
    drafter, embed = _mixed_drafter(5, ("sliding_attention", "sliding_attention"))
    rng = np.random.default_rng(3)
    x = rng.integers(0, 50, size=40)
    blocks = build_blocks([x], [np.ones(40)], [np.array([20])], 4, 3)
    feats = torch.randn(1, 40, 64)
    with torch.no_grad():
        base = drafter_hidden(drafter, embed, feats, blocks)
        later_slot = blocks.input_ids.clone()
        later_slot[0, 2] = 7  # a later block token: slots 0 and 1 must not change
        blocks2 = type(blocks)(blocks.seq, blocks.anchor, later_slot, blocks.labels, blocks.teacher_pos)
        b2 = drafter_hidden(drafter, embed, feats, blocks2)
        assert torch.allclose(b2[0, :2], base[0, :2], atol=1e-6) and not torch.allclose(b2[0, 2:], base[0, 2:])
        # position 20 (slot 0) with W 5 sees context 16..19; two layers widen nothing (K/V come from the
        # same context features), so a feature at 15 changes nothing and one at 16 changes slot 0
        far = feats.clone()
        far[0, 15] += 5.0
        assert torch.allclose(drafter_hidden(drafter, embed, far, blocks), base, atol=1e-6)
        near = feats.clone()
        near[0, 16] += 5.0
        assert not torch.allclose(drafter_hidden(drafter, embed, near, blocks)[0, 0], base[0, 0], atol=1e-4)


def test_drafter_config_layer_types_defaults_and_old_checkpoints():
    old = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
               num_hidden_layers=3, target_layer_ids=[0, 1], block_size=4, mask_token_id=3, vocab_size=50,
               rms_norm_eps=1e-6, rope_theta=1e6, target_model="", model_type="dflash_drafter", extra={})
    cfg = DrafterConfig.from_dict(old)  # a checkpoint written before layer_types existed
    assert cfg.layer_types == ["full_attention"] * 3 and cfg.sliding_window is None
    again = DrafterConfig.from_dict(DrafterConfig(**{**old, "layer_types": ["sliding_attention", "full_attention",
                                                                            "full_attention"],
                                                     "sliding_window": 8}).to_dict())
    assert again.layer_types[0] == "sliding_attention" and again.sliding_window == 8
    with pytest.raises(ValueError, match="sliding_window"):
        DrafterConfig(**{**old, "layer_types": ["sliding_attention"] * 3})
    with pytest.raises(ValueError, match="layer_types"):
        DrafterConfig(**{**old, "layer_types": ["full_attention"] * 2})
    from flashfleet_trainer.drafter import parse_layer_types

    assert parse_layer_types("sliding*4,full", 5) == ["sliding_attention"] * 4 + ["full_attention"]
    with pytest.raises(ValueError, match="not one of"):
        parse_layer_types("linear,full", 2)

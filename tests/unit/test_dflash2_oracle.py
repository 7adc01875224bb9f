"""DFlash 2 against its references: z-lab's `dflash` 0.1.0 (`DFlash2DraftModel`,
`GroupedDynamicCausalConv`, `CandidateSelector`) and vLLM's `speculators` 0.9.0
(`grouped_dynamic_conv`, `CandidateSelector.score_candidates`, `compute_selector_loss`).

The same weights must give the same convolutions, logits, selector scores and greedy paths, and
the selector loss must be speculators' on the same inputs. Both peers are installed with --no-deps
under .cache/peers (requirements/peers.txt); speculators' package __init__ imports its whole
training stack (openai, datasets, ...), so its three modules are loaded under stand-in parent
packages instead (`_speculators`).
"""

import json
import sys
import types
from pathlib import Path

import pytest
import torch
from flashfleet_trainer import export
from flashfleet_trainer.dflash2 import (
    CandidateSelector,
    GroupedDynamicConv,
    grouped_conv,
    selector_loss,
    unary_top_k,
)
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig
from flashfleet_trainer.evaluate import load_exported_drafter
from flashfleet_trainer.loss import IGNORE, position_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PEERS = Path(__file__).resolve().parents[2] / ".cache" / "peers"
H, V, B = 64, 128, 4


def _peers_path():
    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))


def _zlab():
    if not (PEERS / "dflash" / "model.py").is_file():
        pytest.skip(f"z-lab's dflash is not installed under {PEERS} (make venv installs requirements/peers.txt)")
    _peers_path()
    import dflash.model

    return dflash.model


def _speculators():
    """speculators' dflash2 modules (model_definitions, metrics), imported under empty parent
    packages: `import speculators` runs its __init__, which needs openai, datasets and more that
    the controller venv does not have; these two modules need torch and transformers only."""
    root = PEERS / "speculators"
    if not (root / "models" / "dflash2" / "metrics.py").is_file():
        pytest.skip(f"speculators 0.9.0 is not installed under {PEERS} (make venv installs requirements/peers.txt)")
    _peers_path()
    for name in ("speculators", "speculators.models", "speculators.models.dflash", "speculators.models.dflash2",
                 "speculators.models.dspark"):
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = pkg
    import speculators.models.dflash2.metrics as metrics
    import speculators.models.dflash2.model_definitions as defs

    return defs, metrics


def _config(**kw) -> DrafterConfig:
    return DrafterConfig(**{**dict(hidden_size=H, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=16, num_hidden_layers=2, target_layer_ids=[1, 2], block_size=B,
                                   mask_token_id=V - 1, vocab_size=V, rope_theta=10000.0, drafter_kind="dflash2",
                                   selector_rank=32, selector_top_k=8), **kw})


def _randomize(module, scale=0.3):
    """Every convolution away from the identity and every norm away from 1, so a missing or
    misplaced one shows."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, q in module.named_parameters():
            if "conv" in name or name.endswith("norm.weight"):
                q.add_(scale * torch.randn(q.shape, generator=g))


# ---- the convolution ------------------------------------------------------------------------------

@pytest.mark.parametrize("taps,group", [(2, 16), (3, 8)])
def test_grouped_conv_equals_speculators_and_zlab(taps, group):
    defs, _ = _speculators()
    zlab = _zlab()
    n, g = 5, H // group
    x, delta, base = torch.randn(n * B, H), torch.randn(n * B, taps, g), torch.randn(taps, H)
    ours = grouped_conv(x, delta, base, B)
    theirs = defs.grouped_dynamic_conv(x, delta, base, block_size=B, group_size=group)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    # z-lab convolves one drafted block at a time (its rows are one block): the batch of blocks
    zl = zlab._grouped_dynamic_convolve(x.view(n, B, H), delta.view(n, B, taps, g), base, group)
    torch.testing.assert_close(ours, zl.reshape(n * B, H), rtol=1e-6, atol=1e-6)
    # a tap never reaches into the block before: each block alone gives the same rows
    alone = torch.cat([grouped_conv(x[i * B:(i + 1) * B], delta[i * B:(i + 1) * B], base, B) for i in range(n)])
    torch.testing.assert_close(ours, alone)


def test_conv_module_equals_the_peers_modules_and_starts_as_the_identity():
    defs, _ = _speculators()
    zlab = _zlab()
    mine = GroupedDynamicConv(H, 2, 16, B)
    x = torch.randn(3 * B, H)
    y, delta = mine.prepare(x)
    torch.testing.assert_close(y, x)  # identity at init: an untrained DFlash 2 is DFlash
    torch.testing.assert_close(mine.finish(x, delta), x)
    _randomize(mine)
    spec = defs.GroupedDynamicCausalConv(H, block_size=B, kernel_size=2, group_size=16)
    zl = zlab.GroupedDynamicCausalConv(H, 2, 16)
    spec.load_state_dict(mine.state_dict())
    zl.load_state_dict(mine.state_dict())  # the same names: base_kernel, kernel_projection.weight
    y, delta = mine.prepare(x)
    ys, ds = spec.prepare(x)
    yz, dz = zl.prepare(x.view(3, B, H))
    torch.testing.assert_close(y, ys, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y, yz.reshape(3 * B, H), rtol=1e-5, atol=1e-6)
    out = torch.randn(3 * B, H)
    torch.testing.assert_close(mine.finish(out, delta), spec.finish(out, ds), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mine.finish(out, delta), zl.finish(out.view(3, B, H), dz).reshape(3 * B, H),
                               rtol=1e-5, atol=1e-6)


# ---- the selector -------------------------------------------------------------------------------

def _selectors(rank=32, top_k=8):
    defs, _ = _speculators()
    zlab = _zlab()
    torch.manual_seed(0)
    mine = CandidateSelector(H, V, rank, top_k, std=0.3)  # larger than init: transitions that matter
    spec = defs.CandidateSelector(vocab_size=V, hidden_size=H, rank=rank, top_k=top_k)
    spec.load_state_dict(mine.state_dict())
    cfg = types.SimpleNamespace(vocab_size=V, hidden_size=H, dflash_config={"selector_rank": rank, "selector_top_k": top_k})
    zl = zlab.CandidateSelector(cfg)
    # z-lab's codebooks are nn.Embedding (.weight; its from_pretrained maps the format's names)
    zl.load_state_dict({k + (".weight" if k.endswith("codebook") else ""): v for k, v in mine.state_dict().items()})
    return mine, spec, zl


def test_selector_scores_equal_speculators_score_candidates():
    mine, spec, _ = _selectors()
    hidden, head = torch.randn(6, B - 1, H), torch.randn(V, H)
    unary = hidden @ head.T
    cand = unary.topk(mine.top_k, dim=-1).indices
    prev = torch.randint(0, V, (6, B - 1))
    ours = mine.scores(unary.gather(-1, cand), hidden, prev, cand)
    torch.testing.assert_close(ours, spec.score_candidates(unary, hidden, prev, cand), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine.transition_scores(hidden, prev, cand),
                               spec.transition_scores(hidden, prev, cand), rtol=1e-5, atol=1e-5)


def greedy_walk(selector, hidden, unary, anchor):
    """The serving walk through the candidates (what vLLM's and z-lab's selectors draft greedily),
    written on this project's interface: top_k and transition_scores. hidden [P, H], unary [P, V]."""
    cand = unary.topk(selector.top_k, dim=-1).indices
    prev, path = torch.as_tensor(anchor), []
    for k in range(hidden.shape[0]):
        s = unary[k, cand[k]] + selector.transition_scores(hidden[k], prev, cand[k])
        prev = cand[k, s.argmax()]
        path.append(int(prev))
    return path


def test_the_greedy_walk_on_our_interface_is_zlabs():
    mine, _, zl = _selectors()
    hidden, head = torch.randn(5, B - 1, H), torch.randn(V, H)
    unary, anchors = hidden @ head.T, torch.randint(0, V, (5,))
    with torch.no_grad():
        path, _, _ = zl.select(hidden, unary, anchors, 0.0)
        ours = [greedy_walk(mine, hidden[i], unary[i], anchors[i]) for i in range(5)]
    assert ours == path.tolist()
    # and the selector changes drafts: without it each position takes its unary argmax
    assert ours != unary.argmax(-1).tolist()


# ---- the selector loss ---------------------------------------------------------------------------

def test_selector_loss_equals_speculators_compute_selector_loss():
    """Decay weights (speculators' fixed-exp-decay, gamma 4), labels with unsupervised rows, some
    labels outside the unary top-k (injected at rank K). speculators divides by the count of
    supervised rows, this project by the weights' sum (as its unary loss does): one factor apart."""
    _, metrics = _speculators()
    mine, spec, _ = _selectors(top_k=4)
    n, gamma = 7, 4.0
    torch.manual_seed(2)
    hidden, head = torch.randn(n, B, H, requires_grad=True), torch.randn(V, H)
    labels = torch.randint(0, V, (n, B))
    labels[:, 0] = IGNORE
    labels[0, 2:] = IGNORE
    labels[3, 1] = IGNORE
    prev = torch.randint(0, V, (n, B))
    weights = position_weights("decay", labels != IGNORE, gamma=gamma)
    loss, st = selector_loss(mine, hidden[:, 1:], head, labels[:, 1:], prev[:, 1:], weights[:, 1:])
    # speculators, on the whole blocks as it lays them out ([1, N*B, ...])
    unary = (hidden @ head.T).reshape(1, n * B, V)
    valid = (labels != IGNORE).reshape(1, -1)
    target = torch.where(valid, labels.reshape(1, -1), 0)
    ids, index, contains = metrics.selector_training_candidates(unary.topk(4, dim=-1).indices, target)
    scores = spec.score_candidates(unary, hidden.reshape(1, n * B, H), prev.reshape(1, -1), ids)
    theirs = metrics.compute_selector_loss(scores, index, valid, B, gamma=gamma,
                                           per_position_loss_weight="fixed-exp-decay", dpace_alpha=0.5)
    assert not contains[valid].all()  # some labels were injected
    torch.testing.assert_close(loss * weights.sum() / valid.sum(), theirs, rtol=1e-5, atol=1e-6)
    # statistics: recall over supervised rows, accuracy over those whose label is a candidate
    assert st["rows"] == valid.sum() and st["found"] == (contains & valid).sum()
    picked = ids.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)
    assert st["correct"] == ((picked == target) & contains & valid).sum()
    # the gradient reaches the drafter's rows through the unary scores too (hidden . head[c])
    (g,) = torch.autograd.grad(loss, hidden)
    (g_ref,) = torch.autograd.grad(theirs * valid.sum() / weights.sum(), hidden)
    torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-7)


def test_unary_top_k_in_chunks_is_the_full_top_k(monkeypatch):
    import flashfleet_trainer.dflash2 as d2

    hidden, head = torch.randn(37, H), torch.randn(V, H)
    monkeypatch.setattr(d2, "TOPK_CHUNK_ELEMENTS", 5 * V)  # 5 rows a chunk
    torch.testing.assert_close(unary_top_k(hidden, head, 6), (hidden @ head.T).topk(6, dim=-1).indices)


# ---- the drafter, exported, loaded by z-lab ---------------------------------------------------------

def _drafter_and_export(tmp_path, trainer_tiny, **kw):
    torch.manual_seed(0)
    cfg = _config(target_model=str(trainer_tiny / "model"), **kw)
    drafter = DFlashDrafter(cfg)
    _randomize(drafter)
    config, tensors = export.to_dflash(cfg, drafter.state_dict(), export.target_facts(trainer_tiny / "model"))
    return export.write_dir(tmp_path / "d2", config, tensors, "# test\n")


def test_zlab_loads_the_export_and_computes_the_same_logits_and_drafts(tmp_path, trainer_tiny):
    from flashfleet_trainer.target import HiddenStateProducer

    zlab = _zlab()
    out = _drafter_and_export(tmp_path, trainer_tiny)
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["DFlash2DraftModel"] and raw["block_size"] == B
    assert {k: raw["dflash_config"][k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                 "selector_top_k")} == dict(conv_kernel_size=2, conv_group_size=16,
                                                                            selector_rank=32, selector_top_k=8)
    model = zlab.DFlash2DraftModel.from_pretrained(str(out), dtype=torch.float32).eval()
    mine = load_exported_drafter(out, trainer_tiny / "model")  # both from the same bf16 weights
    assert mine.selector is not None and mine.selector.top_k == model.candidate_selector.top_k == 8
    producer = HiddenStateProducer(trainer_tiny / "model", ["cpu"], [1, 2], "cpu")
    seq = list(range(3, 40))
    feats = producer.forward(torch.tensor([seq]))[0][0]
    embed, head = producer.embed_weight, producer.lm_head_weight
    for anchor in (5, 30):
        ids = torch.tensor([seq[anchor]] + [V - 1] * (B - 1))
        with torch.no_grad():
            theirs = model(position_ids=torch.arange(anchor + B)[None], noise_embedding=embed[ids][None],
                           target_hidden=feats[None, :anchor])[0]
            ours = mine(embed[ids], feats[:anchor], torch.arange(anchor), anchor + torch.arange(B),
                        torch.ones(B, anchor + B, dtype=torch.bool))
            torch.testing.assert_close(ours[1:] @ head.T, theirs[1:] @ head.T, rtol=1e-4, atol=1e-4)
            path, _, _ = model.propose(theirs[None, 1:], ids[:1], _head(head), 0.0)
            assert greedy_walk(mine.selector, ours[1:], ours[1:] @ head.T, ids[0]) == path[0].tolist()


@pytest.mark.parametrize("non_causal", [True, False])
def test_zlab_computes_the_sliding_layers_as_exported(tmp_path, trainer_tiny, non_causal):
    """All-sliding DFlash 2 layers with a window shorter than the block: z-lab reads the export's
    is_causal (written false for DFlash 2's non-causal sliding layers, absent for causal ones) and
    computes the same drafts as this trainer's masks (attention.layer_windows, the dense path)."""
    from flashfleet_trainer.evaluate import draft_block_hidden
    from flashfleet_trainer.target import HiddenStateProducer

    zlab = _zlab()
    out = _drafter_and_export(tmp_path, trainer_tiny, layer_types=["sliding_attention"] * 2, sliding_window=3,
                              sliding_window_non_causal=non_causal)
    raw = json.loads((out / "config.json").read_text())
    assert raw.get("is_causal", True) is not non_causal
    model = zlab.DFlash2DraftModel.from_pretrained(str(out), dtype=torch.float32).eval()
    mine = load_exported_drafter(out, trainer_tiny / "model")
    assert mine.config.sliding_window_non_causal is non_causal
    producer = HiddenStateProducer(trainer_tiny / "model", ["cpu"], [1, 2], "cpu")
    seq = list(range(3, 40))
    feats = producer.forward(torch.tensor([seq]))[0]
    embed, head = producer.embed_weight, producer.lm_head_weight
    for anchor in (5, 30):
        ids = torch.tensor([seq[anchor]] + [V - 1] * (B - 1))
        with torch.no_grad():
            theirs = model(position_ids=torch.arange(anchor + B)[None], noise_embedding=embed[ids][None],
                           target_hidden=feats[:, :anchor])[0]
            ours = draft_block_hidden(mine, embed, feats, seq[anchor], anchor, B, V - 1)
            torch.testing.assert_close(ours @ head.T, theirs[1:] @ head.T, rtol=1e-4, atol=1e-4)


def _head(weight):
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    lin.weight = torch.nn.Parameter(weight)
    return lin


def test_an_untrained_dflash2_backbone_is_the_dflash_drafter():
    torch.manual_seed(0)
    d2 = DFlashDrafter(_config())
    d1 = DFlashDrafter(_config(drafter_kind="dflash"))
    d1.load_state_dict({k: v for k, v in d2.state_dict().items() if "conv" not in k and not k.startswith("selector")})
    emb, ctx = torch.randn(2 * B, H), torch.randn(6, 2 * H)
    mask = torch.ones(2 * B, 6 + 2 * B, dtype=torch.bool)
    args = (emb, ctx, torch.arange(6), torch.arange(6, 6 + 2 * B), mask)
    with torch.no_grad():
        torch.testing.assert_close(d2(*args), d1(*args))
        _randomize(d2)
        assert not torch.allclose(d2(*args), d1(*args))


# ---- dflash-export --check ----------------------------------------------------------------------------

def _check(path, capsys, *extra):
    rc = export.main(["--check", str(path), *extra])
    return rc, capsys.readouterr()


def test_check_accepts_the_export_and_refuses_what_a_client_would(tmp_path, trainer_tiny, capsys):
    from flashfleet.contract.messages import EX_CONFIG

    out = _drafter_and_export(tmp_path, trainer_tiny)
    rc, cap = _check(out, capsys, "--num-speculative-tokens", str(B - 1))
    assert rc == 0 and "DFlash2DraftModel" in cap.out and f"num_speculative_tokens {B - 1}" in cap.out

    def refused(*extra, edit=None):
        d = out
        if edit:
            d = tmp_path / f"edited{len(list(tmp_path.iterdir()))}"
            d.mkdir()
            for f in out.iterdir():
                (d / f.name).write_bytes(f.read_bytes())
            raw = json.loads((d / "config.json").read_text())
            edit(raw)
            (d / "config.json").write_text(json.dumps(raw))
        rc, cap = _check(d, capsys, *extra)
        lines = cap.err.strip().splitlines()
        assert rc == EX_CONFIG and len(lines) == 1 and "(fix: " in lines[0], cap.err
        return lines[0]

    # vLLM's convolution positions: row % (num_speculative_tokens + 1)
    assert "num_speculative_tokens 7" in refused("--num-speculative-tokens", "7")
    # vLLM reads the four settings from dflash_config alone (KeyError otherwise)
    assert "dflash_config.selector_rank" in refused(edit=lambda c: c["dflash_config"].pop("selector_rank"))
    assert "does not divide" in refused(edit=lambda c: c["dflash_config"].update(conv_group_size=24))
    assert "exceeds the block size" in refused(edit=lambda c: c["dflash_config"].update(conv_kernel_size=B + 1))
    # the weights must be the config's: selector rank 16 is not the tensors' 32
    assert "candidate_selector" in refused(edit=lambda c: c["dflash_config"].update(selector_rank=16))
    # a DFlash 2 directory named a DFlash drafter: a DFlash loader would drop the convolutions
    assert "conv_kernel_size=2" in refused(edit=lambda c: c.update(architectures=["DFlashDraftModel"]))


def test_the_vllm_serve_check_refuses_another_block(tmp_path, trainer_tiny, capsys):
    """vllm_serve_check (run in vLLM's venv, importing nothing of flashfleet) refuses a
    num_speculative_tokens other than block_size - 1 before it starts an engine."""
    from flashfleet.contract.messages import EX_CONFIG
    from flashfleet_trainer import vllm_serve_check

    assert vllm_serve_check.EX_CONFIG == EX_CONFIG
    out = _drafter_and_export(tmp_path, trainer_tiny)
    rc = vllm_serve_check.main([str(trainer_tiny / "model"), str(out), "p.json", "o.json",
                                "--num-speculative-tokens", "7"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EX_CONFIG and len(err) == 1 and "row % 8" in err[0] and "--num-speculative-tokens 3" in err[0]
    assert vllm_serve_check.block_size_problem(out, B - 1) is None


def test_selector_candidates_from_the_unary_loss_equal_its_own_pass():
    """The trainer hands selector_loss the top-k the unary loss took from its own logits
    (drafter_loss(top_k=K)); the loss, its statistics and its gradient equal those of the
    selector's own pass over the vocabulary (unary_top_k)."""
    from flashfleet_trainer.dflash2 import unary_top_k
    from flashfleet_trainer.loss import drafter_loss, get_loss_fn

    mine, _, _ = _selectors(top_k=4)
    torch.manual_seed(3)
    n = 6
    hidden, head = torch.randn(n, B, H), torch.randn(V, H)
    labels = torch.randint(0, V, (n, B))
    labels[:, 0] = IGNORE
    labels[2, 3:] = IGNORE
    prev = torch.randint(0, V, (n, B))
    _, st = drafter_loss(hidden, None, head, labels, loss_fn=get_loss_fn("torch")[0], weighting="streak",
                         top_k=mine.top_k, host_stats=False)
    rows = hidden[:, 1:].reshape(-1, H)
    assert st["top_ids"].shape == (n, B - 1, 4)
    assert torch.equal(st["top_ids"].reshape(-1, 4), unary_top_k(rows, head, 4))
    got, want = [], []
    for out, cand in ((got, st["top_ids"]), (want, None)):
        h = hidden.clone().requires_grad_()
        loss, stats = selector_loss(mine, h[:, 1:], head, st["labels"], prev[:, 1:], st["weights"][:, 1:],
                                    candidates=cand)
        loss.backward()
        out += [loss.detach(), stats["correct"], stats["found"], h.grad]
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)

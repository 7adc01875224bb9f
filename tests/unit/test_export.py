"""dflash-export, dflash-eval --drafter and dflash-train --init-from: the DFlash directory format.

The format is what vLLM, SGLang and z-lab's `dflash` load (docs/export.md). Two clients read the
exported directory here: an independent loader written below from the format alone (plain torch,
safetensors and config.json), and z-lab's own `DFlashDraftModel` with its speculative loop.
"""

import dataclasses
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from flashfleet.contract import checkpoint as contract
from flashfleet.contract.messages import EX_CONFIG
from flashfleet_trainer import export
from flashfleet_trainer.checkpoint import newest_complete
from flashfleet_trainer.cli import main as train_main
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.drafter import DFlashDrafter, drafter_hidden, load_drafter
from flashfleet_trainer.errors import ConfigError
from flashfleet_trainer.evaluate import load_exported_drafter, load_prompts, speculative_tau
from flashfleet_trainer.evaluate import main as eval_main
from flashfleet_trainer.target import HiddenStateProducer
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / ".cache" / "peers"
# The drafter of these tests: 2 layers on two distinct target layers, block 4 (trainer_argv's rest).
DRAFTER = ("--num-draft-layers", "2", "--target-layers", "1,2")
_CACHE = {}


def _train(trainer_argv, out, *extra):
    argv = trainer_argv(*DRAFTER, "--max-steps", "6", "--save-interval", "3", "--resume", "never", *extra, out=out)
    assert train_main(argv) == 0
    return out


@pytest.fixture
def run_dir(trainer_argv, tmp_path_factory):
    """A run of a few steps on the tiny assets (trained once per module; tests must not modify it)."""
    if "run" not in _CACHE:
        out = tmp_path_factory.mktemp("export") / "run"
        _CACHE["run"] = _train(trainer_argv, out, "--eval-num-prompts", "2", "--eval-max-new-tokens", "8")
    return _CACHE["run"]


@pytest.fixture
def exported(run_dir, tmp_path_factory):
    """dflash-export of run_dir's newest checkpoint (once per module)."""
    if "exported" not in _CACHE:
        out = tmp_path_factory.mktemp("exported") / "drafter"
        assert export.main([str(run_dir), str(out)]) == 0
        _CACHE["exported"] = out
    return _CACHE["exported"]


def _refused(argv, capsys) -> str:
    """export.main(argv) must exit 78 with one stderr line; that line."""
    rc = export.main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EX_CONFIG, err
    lines = [line for line in err if not line.startswith("dflash-export: ")]
    assert len(lines) == 1 and lines[0].startswith("flashfleet-train: config error: ") and "(fix: " in lines[0]
    return lines[0]


def _snapshot(d: Path) -> dict:
    """{relative path: bytes} of everything under d (and d's siblings' names: no leftovers beside it)."""
    files = {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()} if d.exists() else None
    return {"files": files, "siblings": sorted(os.listdir(d.parent))}


# ---- an independent loader, from the format alone -------------------------------------------------

def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos().float(), torch.cat([ang, ang], -1).sin().float()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos[:, None] + torch.cat([-x2, x1], -1) * sin[:, None]


def independent_logits(drafter_dir, embed, head, feats, seq, anchor):
    """Draft logits [B-1, V] for the block anchored at `anchor` of token list `seq`, computed from
    config.json + model.safetensors with plain torch. feats [T, K*H]: the target's features
    (outputs of decoder layers dflash_config.target_layer_ids, concatenated in that order)."""
    cfg = json.loads((Path(drafter_dir) / "config.json").read_text())
    w = {k: v.float() for k, v in load_file(str(Path(drafter_dir) / "model.safetensors")).items()}
    eps, theta, b = cfg["rms_norm_eps"], cfg["rope_theta"], cfg["block_size"]
    nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    assert all(t == "full_attention" for t in cfg["layer_types"])
    ctx = _rms(feats[:anchor] @ w["fc.weight"].T, w["hidden_norm.weight"], eps)  # context: positions < anchor
    ids = [seq[anchor]] + [cfg["dflash_config"]["mask_token_id"]] * (b - 1)
    x = embed[torch.tensor(ids)]
    pos_q = anchor + torch.arange(b)
    pos_kv = torch.cat([torch.arange(anchor), pos_q])
    for n in range(cfg["num_hidden_layers"]):
        p = f"layers.{n}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        kv_in = torch.cat([ctx, h])  # context K/V: no input_layernorm
        q = _rms((h @ w[p + "self_attn.q_proj.weight"].T).view(b, nh, d), w[p + "self_attn.q_norm.weight"], eps)
        k = _rms((kv_in @ w[p + "self_attn.k_proj.weight"].T).view(-1, nkv, d), w[p + "self_attn.k_norm.weight"], eps)
        v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(-1, nkv, d)
        q, k = _rotate(q, pos_q, theta), _rotate(k, pos_kv, theta)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        att = torch.einsum("qhd,khd->hqk", q, k) / d ** 0.5  # full, non-causal: context + whole block
        o = torch.einsum("hqk,khd->qhd", att.softmax(-1), v).reshape(b, nh * d)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) \
            @ w[p + "mlp.down_proj.weight"].T
    x = _rms(x, w["norm.weight"], eps)
    return x[1:] @ head.T  # slot k predicts the token at anchor + k; slot 0 is discarded


def project_logits(drafter, embed, head, feats, seq, anchor):
    """The same through the project's drafter (drafter.DFlashDrafter) with an all-visible mask."""
    b = drafter.config.block_size
    ids = torch.tensor([seq[anchor]] + [drafter.config.mask_token_id] * (b - 1))
    mask = torch.ones(b, anchor + b, dtype=torch.bool)
    with torch.no_grad():
        out = drafter(embed[ids], feats[:anchor], torch.arange(anchor), anchor + torch.arange(b), mask)
    return out[1:] @ head.T


def _format_names(n_layers):
    names = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for n in range(n_layers):
        names |= {f"layers.{n}.{s}.weight" for s in (
            "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
            "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    return names


def _inputs(trainer_tiny, drafter):
    producer = HiddenStateProducer(trainer_tiny / "model", ["cpu"], drafter.config.target_layer_ids, "cpu")
    seq = load_prompts(trainer_tiny / "data" / "eval" / "prompts.jsonl", 1)[0] + [5, 6, 7, 8, 9, 10]
    feats, _ = producer.forward(torch.tensor([seq]))
    return producer, seq, feats[0]


# ---- (a) the format, read back without the project ------------------------------------------------

def test_export_writes_the_dflash_format_and_an_independent_loader_matches(run_dir, exported, trainer_tiny):
    # a serving process that runs as another user reads every file (as the HF cache writes them)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in exported.iterdir()} == dict.fromkeys(
        ("config.json", "model.safetensors", "README.md"), 0o644)
    assert stat.S_IMODE(exported.stat().st_mode) == 0o755
    cfg = json.loads((exported / "config.json").read_text())
    tcfg = json.loads((trainer_tiny / "model" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == 4 and cfg["dflash_config"]["target_layer_ids"] == [1, 2]
    assert cfg["dflash_config"]["mask_token_id"] == tcfg["vocab_size"] - 1
    assert cfg["num_target_layers"] == tcfg["num_hidden_layers"] == 4
    assert cfg["vocab_size"] == tcfg["vocab_size"] and cfg["max_position_embeddings"] == tcfg["max_position_embeddings"]
    assert cfg["hidden_act"] == "silu" and cfg["attention_bias"] is False and cfg["tie_word_embeddings"] is False
    assert cfg["layer_types"] == ["full_attention"] * 2 and cfg["sliding_window"] is None
    assert cfg["use_sliding_window"] is False and cfg["dtype"] == "bfloat16" and "rope_theta" in cfg
    weights = load_file(str(exported / "model.safetensors"))
    assert set(weights) == _format_names(2) and all(t.dtype == torch.bfloat16 for t in weights.values())
    assert weights["fc.weight"].shape == (64, 2 * 64)
    card = (exported / "README.md").read_text()
    ckpt = newest_complete(run_dir / "checkpoints")
    tau = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"tau"' in x][-1]["tau"]
    assert f"{tau:.3f}" in card and "vllm serve" in card and '"method": "dflash"' in card
    assert "--speculative-algorithm DFLASH" in card and str(exported) in card and str(ckpt) in card
    assert not [p for p in exported.parent.iterdir() if p.name.startswith(".")]  # no temp dir left

    trained = load_drafter(ckpt)  # fp32 master weights
    producer, seq, feats = _inputs(trainer_tiny, trained)
    embed, head = producer.embed_weight, producer.lm_head_weight
    for anchor in (5, len(seq) - 4):
        mine = independent_logits(exported, embed, head, feats, seq, anchor)
        ours = project_logits(trained, embed, head, feats, seq, anchor)
        # bf16 weights against fp32 ones: relative error of the weights (2^-8) through two layers
        assert (mine - ours).abs().max() <= 2e-2 * ours.abs().max() + 1e-3, anchor
        # and exactly the same function once the project's drafter has the exported (bf16) weights
        same = project_logits(load_exported_drafter(exported, trainer_tiny / "model"), embed, head, feats, seq, anchor)
        torch.testing.assert_close(mine, same, atol=1e-4, rtol=1e-4)


def test_load_dflash_dir_round_trips_and_validates(exported, tmp_path):
    cfg, state = export.load_dflash_dir(exported)
    assert cfg.block_size == 4 and cfg.target_layer_ids == [1, 2] and cfg.vocab_size == 128
    DFlashDrafter(cfg).load_state_dict(state)  # our names, every tensor, right shapes

    def broken(edit_weights=None, edit_config=None):
        d = tmp_path / f"d{len(list(tmp_path.iterdir()))}"
        shutil.copytree(exported, d)
        if edit_weights:
            w = load_file(str(d / "model.safetensors"))
            edit_weights(w)
            save_file(w, str(d / "model.safetensors"))
        if edit_config:
            c = json.loads((d / "config.json").read_text())
            edit_config(c)
            (d / "config.json").write_text(json.dumps(c))
        with pytest.raises(ConfigError) as e:
            export.load_dflash_dir(d)
        return e.value.line()

    assert "missing layers.1.mlp.down_proj.weight" in broken(lambda w: w.pop("layers.1.mlp.down_proj.weight"))
    assert "fc.weight has shape [64, 64], expected [64, 128]" in broken(
        lambda w: w.__setitem__("fc.weight", w["fc.weight"][:, :64].contiguous()))
    msg = broken(lambda w: w.__setitem__("lm_head.weight", torch.zeros(128, 64, dtype=torch.bfloat16)))
    assert "unknown tensor(s) lm_head.weight" in msg and "uses the target's" in msg
    assert "missing dflash_config.mask_token_id" in broken(edit_config=lambda c: c["dflash_config"].pop("mask_token_id"))
    assert "missing hidden_size" in broken(edit_config=lambda c: c.pop("hidden_size"))
    assert "final_logit_softcapping" in broken(edit_config=lambda c: c.update(final_logit_softcapping=30.0))
    d = tmp_path / "trunc"
    shutil.copytree(exported, d)
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(os.path.getsize(d / "model.safetensors") - 10)
    with pytest.raises(ConfigError, match="model.safetensors"):
        export.load_dflash_dir(d)


# ---- (2) dflash-eval --drafter ---------------------------------------------------------------------

def test_eval_of_the_export_equals_the_checkpoint_cast_to_bf16(run_dir, exported, trainer_tiny, tmp_path, capsys):
    """The exported directory's tau equals its checkpoint's, greedy on the same prompts.

    The format stores bf16 (as every published drafter and SpecForge config does), so the export
    is the checkpoint rounded to bf16: on CPU that rounding can flip a near-tied argmax and change
    tau, which would make "export tau == fp32 checkpoint tau" flaky without saying anything about
    the format. So the reference is the checkpoint's weights cast to bf16 and back, run by the same
    evaluator in the same dtype (fp32): the two must then propose the same drafts in every cycle,
    accept the same tokens and give the same tau, exactly. dflash-eval --drafter must print it too.
    """
    ckpt = newest_complete(run_dir / "checkpoints")
    reference = load_drafter(ckpt)
    with torch.no_grad():
        for q in reference.parameters():
            q.copy_(q.to(torch.bfloat16).float())
    mine = load_exported_drafter(exported, trainer_tiny / "model")
    prompts_path = trainer_tiny / "data" / "eval" / "prompts.jsonl"
    prompts = load_prompts(prompts_path, 2)
    producer = HiddenStateProducer(trainer_tiny / "model", ["cpu"], mine.config.target_layer_ids, "cpu")
    ta, tb = [], []
    ra = speculative_tau(producer, reference, prompts, 4, 8, trace=ta)
    rb = speculative_tau(producer, mine, prompts, 4, 8, trace=tb)
    assert ta == tb and ra == rb
    common = ["--target-model", str(trainer_tiny / "model"), "--prompts", str(prompts_path), "--num-prompts", "2",
              "--max-new-tokens", "8"]
    assert eval_main([*common, "--drafter", str(exported)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["tau"] == ra["tau"] and printed["cycles"] == ra["cycles"]
    assert eval_main([*common, "--checkpoint", str(ckpt)]) == 0  # the checkpoint path still works
    assert 1.0 <= json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tau"] <= 4.0
    bad = tmp_path_target(tmp_path, trainer_tiny, vocab_size=256)
    assert eval_main(["--target-model", str(bad), "--prompts", str(prompts_path), "--drafter", str(exported)]) == EX_CONFIG
    assert "vocabulary mismatch" in capsys.readouterr().err


def tmp_path_target(where: Path, trainer_tiny, **changes) -> Path:
    """A target directory whose config.json is the tiny target's with `changes` (config only: the
    exporter reads nothing else of the target)."""
    d = where / ("target-" + "-".join(f"{k}{v}" for k, v in changes.items()))
    d.mkdir(exist_ok=True)
    c = json.loads((trainer_tiny / "model" / "config.json").read_text())
    c.update(changes)
    (d / "config.json").write_text(json.dumps(c))
    return d


# ---- (c) refusals: one line naming the problem, OUT_DIR untouched ---------------------------------------

@pytest.fixture
def ckpt_copy(run_dir, tmp_path):
    """A copy of run_dir's newest checkpoint that a test may damage."""
    src = newest_complete(run_dir / "checkpoints")
    dst = tmp_path / "ckpts" / src.name
    shutil.copytree(src, dst)
    return dst


@pytest.fixture
def old_out(tmp_path):
    """An existing OUT_DIR holding an older export: refusals must leave it exactly as it is."""
    out = tmp_path / "out" / "drafter"
    out.mkdir(parents=True)
    (out / "config.json").write_text("{\"old\": true}\n")
    return out


def test_truncated_safetensors_is_refused(ckpt_copy, old_out, capsys):
    before = _snapshot(old_out)
    w = ckpt_copy / "drafter.safetensors"
    with open(w, "r+b") as f:
        f.truncate(os.path.getsize(w) - 100)
    assert "drafter.safetensors" in _refused([ckpt_copy, old_out, "--force"], capsys)  # the manifest's size
    contract.write_manifest(str(ckpt_copy), 6)  # a manifest that agrees: the header check must catch it
    line = _refused([ckpt_copy, old_out, "--force"], capsys)
    assert "drafter.safetensors" in line and "outside" in line
    assert _snapshot(old_out) == before


def test_wrong_target_layer_ids_is_refused(ckpt_copy, old_out, capsys):
    before = _snapshot(old_out)
    c = json.loads((ckpt_copy / "config.json").read_text())
    c["target_layer_ids"] = [1, 2, 3]  # fc.weight was trained for two feature layers
    (ckpt_copy / "config.json").write_text(json.dumps(c))
    contract.write_manifest(str(ckpt_copy), 6)
    line = _refused([ckpt_copy, old_out, "--force"], capsys)
    assert "fc.weight has shape [64, 128], expected [64, 192]" in line
    assert _snapshot(old_out) == before


def test_layer_ids_vllm_cannot_serve_are_refused(ckpt_copy, old_out, exported, trainer_argv, tmp_path, capsys):
    """A checkpoint whose target layers are out of order (trained before the rule) is not exported, and
    an --init-from drafter with them is refused: vLLM would feed it its features in the wrong order."""
    before = _snapshot(old_out)
    c = json.loads((ckpt_copy / "config.json").read_text())
    c["target_layer_ids"] = [2, 1]
    (ckpt_copy / "config.json").write_text(json.dumps(c))
    contract.write_manifest(str(ckpt_copy), 6)
    line = _refused([ckpt_copy, old_out, "--force"], capsys)
    assert "target layer ids [2, 1] are not strictly ascending" in line and "not served by vLLM" in line
    assert _snapshot(old_out) == before
    theirs = tmp_path / "reversed"
    shutil.copytree(exported, theirs)
    cfg = json.loads((theirs / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [2, 1]
    (theirs / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as e:
        export.check_init_from(str(theirs), None)
    assert "not strictly ascending" in e.value.what and "--init-from" in e.value.what


def test_vocabulary_mismatch_is_refused(ckpt_copy, old_out, trainer_tiny, tmp_path, capsys):
    before = _snapshot(old_out)
    target = tmp_path_target(tmp_path, trainer_tiny, vocab_size=256)
    line = _refused([ckpt_copy, old_out, "--force", "--target-model", target], capsys)
    assert "vocabulary mismatch" in line and "vocab_size 256" in line and "128" in line
    assert _snapshot(old_out) == before


def test_checkpoint_of_another_target_is_refused(ckpt_copy, old_out, trainer_tiny, tmp_path, capsys):
    before = _snapshot(old_out)
    wider = tmp_path_target(tmp_path, trainer_tiny, hidden_size=96)
    assert "hidden size mismatch" in _refused([ckpt_copy, old_out, "--force", "--target-model", wider], capsys)
    shallow = tmp_path_target(tmp_path, trainer_tiny, num_hidden_layers=2)
    assert "target_layer_ids [1, 2]" in _refused([ckpt_copy, old_out, "--force", "--target-model", shallow], capsys)
    # the checkpoint's own target path, when that target is gone
    c = json.loads((ckpt_copy / "config.json").read_text())
    c["target_model"] = str(tmp_path / "gone")
    (ckpt_copy / "config.json").write_text(json.dumps(c))
    contract.write_manifest(str(ckpt_copy), 6)
    assert "cannot read the target's config" in _refused([ckpt_copy, old_out, "--force"], capsys)
    assert _snapshot(old_out) == before


def test_existing_out_dir_needs_force_and_force_replaces_atomically(run_dir, old_out, capsys):
    before = _snapshot(old_out)
    assert "already exists" in _refused([run_dir, old_out], capsys)
    assert _snapshot(old_out) == before
    assert export.main([str(run_dir), str(old_out), "--force"]) == 0
    assert json.loads((old_out / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    assert sorted(p.name for p in old_out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert os.listdir(old_out.parent) == ["drafter"]  # the old directory and the temp dir are gone
    assert "no complete checkpoint" in _refused([old_out.parent, old_out.parent / "x"], capsys)


# ---- (b) a real client: z-lab's dflash --------------------------------------------------------------

def _zlab():
    if not (PEERS / "dflash" / "model.py").is_file():
        pytest.skip(f"z-lab's dflash is not installed under {PEERS} (make venv installs requirements/peers.txt)")
    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    import dflash.model

    return dflash.model


def _zlab_block_logits(model, embed, head, feats, seq, anchor, block_size=4, mask_id=127):
    """z-lab's DFlashDraftModel drafting the block after `anchor`: logits of its block_size - 1 drafts."""
    ids = torch.tensor([[seq[anchor]] + [mask_id] * (block_size - 1)])
    with torch.no_grad():
        hidden = model(position_ids=torch.arange(anchor + block_size)[None], noise_embedding=embed[ids],
                       target_hidden=feats[None, :anchor])
    return hidden[0, 1:] @ head.T


def test_zlab_loads_the_export_and_computes_the_same_drafts(run_dir, exported, trainer_tiny):
    zlab = _zlab()
    model = zlab.DFlashDraftModel.from_pretrained(str(exported), dtype=torch.float32).eval()
    assert model.block_size == 4 and model.mask_token_id == 127 and list(model.target_layer_ids) == [1, 2]
    assert not any(layer.self_attn.is_causal for layer in model.layers)
    mine = load_exported_drafter(exported, trainer_tiny / "model")
    trained = load_drafter(newest_complete(run_dir / "checkpoints"))
    producer, seq, feats = _inputs(trainer_tiny, mine)
    embed, head = producer.embed_weight, producer.lm_head_weight
    for anchor in (4, len(seq) - 4):
        theirs = _zlab_block_logits(model, embed, head, feats, seq, anchor)
        torch.testing.assert_close(theirs, project_logits(mine, embed, head, feats, seq, anchor), atol=1e-4, rtol=1e-4)
        ours = project_logits(trained, embed, head, feats, seq, anchor)
        assert (theirs - ours).abs().max() <= 2e-2 * ours.abs().max() + 1e-3


def _block_logits(drafter, embed, head, feats, seq, anchor):
    """The project's drafter on one block through its public path (drafter_hidden builds the masks
    each layer type needs)."""
    from flashfleet_trainer.data import Blocks

    b = drafter.config.block_size
    ids = torch.tensor([[seq[anchor]] + [drafter.config.mask_token_id] * (b - 1)])
    blocks = Blocks(seq=torch.zeros(1, dtype=torch.long), anchor=torch.tensor([anchor]), input_ids=ids,
                    labels=torch.full_like(ids, -100), teacher_pos=torch.zeros_like(ids))
    with torch.no_grad():
        return drafter_hidden(drafter, embed, feats[None], blocks)[0, 1:] @ head.T


def test_sliding_layers_export_and_zlab_reads_them_the_same(trainer_tiny, tmp_path):
    """A drafter with a sliding-attention layer (window 3, causal inside the block) exported with
    use_sliding_window: true: z-lab builds its layers causal with that window, and its logits equal
    the project's (dense masks per layer type)."""
    from flashfleet_trainer.drafter import DrafterConfig

    if "layer_types" not in DrafterConfig.__dataclass_fields__:
        pytest.skip("this DrafterConfig has no layer_types yet")
    zlab = _zlab()
    torch.manual_seed(0)
    cfg = DrafterConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, num_hidden_layers=2, target_layer_ids=[1, 2], block_size=4, mask_token_id=127,
                        vocab_size=128, rope_theta=10000.0, layer_types=["sliding_attention", "full_attention"],
                        sliding_window=3, target_model=str(trainer_tiny / "model"))
    drafter = DFlashDrafter(cfg)
    with torch.no_grad():
        for name, q in drafter.named_parameters():
            if name.endswith("norm.weight"):
                q.add_(0.1 * torch.randn_like(q))  # norms away from 1, so a swapped norm would show
    config, tensors = export.to_dflash(cfg, drafter.state_dict(), export.target_facts(trainer_tiny / "model"))
    out = export.write_dir(tmp_path / "swa", config, tensors, "# test\n")
    raw = json.loads((out / "config.json").read_text())
    assert raw["use_sliding_window"] is True and raw["sliding_window"] == 3
    assert raw["layer_types"] == ["sliding_attention", "full_attention"]
    model = zlab.DFlashDraftModel.from_pretrained(str(out), dtype=torch.float32).eval()
    attn = [layer.self_attn for layer in model.layers]
    assert (attn[0].is_causal, attn[0].sliding_window, attn[1].is_causal, attn[1].sliding_window) == (True, 3, False, None)
    mine = load_exported_drafter(out, trainer_tiny / "model")
    assert mine.config.layer_types == cfg.layer_types and mine.config.sliding_window == 3
    producer, seq, feats = _inputs(trainer_tiny, mine)
    embed, head = producer.embed_weight, producer.lm_head_weight
    for anchor in (5, len(seq) - 4):
        torch.testing.assert_close(_zlab_block_logits(model, embed, head, feats, seq, anchor),
                                   _block_logits(mine, embed, head, feats, seq, anchor),
                                   atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A target trained long enough (100 steps) that a drafter learns to be accepted, a drafter run
    on it, and its export. trainer_tiny's target (30 steps) is near uniform: its drafters accept
    nothing, and "the same accepted tokens" would compare zeros."""
    from flashfleet_trainer.tiny import build

    root = tmp_path_factory.mktemp("served")
    build(root / "tiny", seed=0, vocab=128, hidden=64, layers=4, steps=100, num_seqs=64, prompt_len=8,
          completion_len=24, num_eval=3, log=lambda s: None)
    tiny = root / "tiny"
    argv = ["--target-model", str(tiny / "model"), "--data-dir", str(tiny / "data"), "--output-dir",
            str(root / "run"), "--target-gpus", "cpu", "--drafter-gpus", "cpu", "--block-size", "4",
            "--num-draft-layers", "1", "--token-budget", "256", "--max-seq-len", "32", "--max-batch-size", "8",
            "--max-anchors", "16", "--lr", "3e-3", "--warmup-ratio", "0.1", "--max-steps", "100",
            "--eval-num-prompts", "0", "--log-interval", "1000"]
    assert train_main(argv) == 0
    assert export.main([str(root / "run"), str(root / "drafter")]) == 0
    return tiny, root / "drafter"


@pytest.mark.slow
def test_zlab_speculative_loop_accepts_what_our_evaluator_accepts(served):
    """z-lab's own greedy loop (dflash_generate: KV caches on both sides, cache cropping) against the
    tiny Qwen3 target loaded with transformers, and the project's evaluator (no cache): the same
    drafts in every full cycle, the same tokens committed per cycle, the same output."""
    import time

    zlab = _zlab()
    tiny, drafter_dir = served
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(str(tiny / "model"), dtype=torch.float32,
                                                  attn_implementation="sdpa").eval()
    model = zlab.DFlashDraftModel.from_pretrained(str(drafter_dir), dtype=torch.float32).eval()
    mine = load_exported_drafter(drafter_dir, tiny / "model")
    prompts = load_prompts(tiny / "data" / "eval" / "prompts.jsonl", 3)
    producer = HiddenStateProducer(tiny / "model", ["cpu"], mine.config.target_layer_ids, "cpu")
    trace = []
    res = speculative_tau(producer, mine, prompts, 4, 16, trace=trace)
    assert res["tau"] > 1.1, res  # the comparison below is about accepted drafts, not only bonus tokens
    block, new = 4, 16
    for prompt, ours in zip(prompts, trace, strict=True):
        drafts, compute_logits = [], model.compute_logits

        def recording(hidden, output_head, _f=compute_logits, _d=drafts):
            logits = _f(hidden, output_head)
            _d.append(logits.argmax(-1)[0].tolist())
            return logits

        model.compute_logits = recording
        real_time = zlab._cuda_time
        zlab._cuda_time = time.perf_counter  # return_stats times with torch.cuda.synchronize(): CPU here
        try:
            st = zlab.dflash_generate(model, target, torch.tensor([prompt]), new, None, return_stats=True)
        finally:
            zlab._cuda_time, model.compute_logits = real_time, compute_logits
        # cycles with a whole block to verify and no truncation at max_length
        start, full = len(prompt), 0
        for produced in st.acceptance_lengths:
            if start + block + 1 > len(prompt) + new:
                break
            full, start = full + 1, start + produced
        assert full >= 3
        assert st.acceptance_lengths[:full] == ours["committed"][:full]
        assert drafts[:full] == ours["drafts"][:full]
        out = st.output_ids[0, len(prompt):].tolist()
        n = min(len(out), len(ours["output"]))
        assert out[:n] == ours["output"][:n]


# ---- (d) --init-from -----------------------------------------------------------------------------

def test_init_from_loads_the_exported_weights_before_the_first_step(exported, trainer_argv, tmp_path):
    from flashfleet_trainer.metrics import Status
    from flashfleet_trainer.preflight import preflight
    from flashfleet_trainer.trainer import Trainer

    args = parse_args(trainer_argv(*DRAFTER, "--init-from", str(exported), "--resume", "never"))
    facts = preflight(args)
    export.check_init_from(args.init_from, facts.drafter_config)  # the same drafter: no complaint
    trainer = Trainer(args, facts, Status.null(), log=lambda s: None)
    trainer.setup()
    try:
        _cfg, want = export.load_dflash_dir(exported)
        have = trainer.drafter.state_dict()
        assert have.keys() == want.keys()
        for k in want:
            assert torch.equal(have[k], want[k]), k
        assert trainer.step == 0
    finally:
        trainer.feed.close()
    # and the real start trains on from there (--config key init_from works like the flag)
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"init_from": str(exported)}))
    assert train_main(["--config", str(cfg), *trainer_argv(*DRAFTER, "--max-steps", "1", out=tmp_path / "r2")]) == 0


def test_init_from_mismatch_is_refused(exported, trainer_argv, tmp_path, capsys):
    from flashfleet_trainer.preflight import preflight

    args = parse_args(trainer_argv(*DRAFTER, "--init-from", str(exported)))
    dcfg = preflight(args).drafter_config
    export.check_init_from(None, dataclasses.replace(dcfg, block_size=99))  # no-op
    cases = [(dict(block_size=8), "block size 4 there, 8 here", "--block-size 4"),
             (dict(target_layer_ids=[1, 3]), "target_layer_ids [1, 2] there, [1, 3] here", "--target-layers 1,2"),
             (dict(num_hidden_layers=3, **({"layer_types": []} if hasattr(dcfg, "layer_types") else {})),
              "draft layers 2 there, 3 here", "--num-draft-layers 2"),
             (dict(hidden_size=96), "hidden size 64 there, 96 here", "target"),
             (dict(vocab_size=256), "vocab 128 there, 256 here", "target")]
    for change, what, fix in cases:
        with pytest.raises(ConfigError) as e:
            export.check_init_from(args.init_from, dataclasses.replace(dcfg, **change))
        assert what in e.value.what and fix in e.value.fix, (change, e.value.line())
    # a real start with a mismatch exits 78 with one line (the Trainer checks before loading)
    rc = train_main(trainer_argv(*DRAFTER, "--init-from", str(exported), "--block-size", "8", "--max-steps", "1",
                                 out=tmp_path / "r3"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EX_CONFIG and "block size 4 there, 8 here" in err[-1]


def test_collect_with_export_brings_the_drafter_home(run_dir, tmp_path, run_playbook):
    """collect.yml -e export=true on a host (this machine, local connection): the host exports its
    newest complete checkpoint with the venv's dflash-export and the directory comes home to
    runs/<run>/drafter/; a second collect with the same checkpoint does not export again."""
    import getpass

    host_root = tmp_path / "host"  # a copy: the module's run_dir stays as trained
    shutil.copytree(run_dir, host_root / run_dir.name)
    run_dir, run = host_root / run_dir.name, run_dir.name
    inv = tmp_path / "hosts.json"
    inv.write_text(json.dumps({"all": {"vars": {"flashfleet_runs": {run: {}}}, "children": {"gpu_nodes": {"hosts": {
        "here": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))
    home = tmp_path / "runs"

    def collect():
        r = run_playbook(ROOT / "collect.yml", inv, run=run, export=True, flashfleet_runs_dir=str(home),
                         flashfleet_runs_root=str(run_dir.parent), flashfleet_venv=sys.prefix,
                         run_collect_export_user=getpass.getuser(), run_collect_use_rsync="false")
        assert r.rc == 0, r.stdout.read()
        return {e["event_data"]["task"]: e["event_data"]["res"].get("changed", False)
                for e in r.events if e.get("event") == "runner_on_ok" and e["event_data"].get("host") == "here"}

    first = collect()
    name = "Export the newest complete checkpoint (dflash-export, as the run's user)"
    assert first[name]
    drafter = home / run / "drafter"
    config = json.loads((drafter / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert (drafter / "model.safetensors").read_bytes() == (run_dir / "drafter" / "model.safetensors").read_bytes()
    assert "vllm serve" in (drafter / "README.md").read_text()
    assert name not in collect(), "the same newest checkpoint is not exported again"

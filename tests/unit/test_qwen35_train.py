"""End to end on the hybrid tiny target (`dflash-tiny --arch qwen3_5`): a Qwen3.5-layout
multimodal checkpoint (Gated-DeltaNet + full attention, tiny vision tower, sharded with an index)
is trained on, a drafter with a sliding-window layer and a full layer is trained on its hidden
states on CPU, and the real acceptance length tau of speculative decoding with the target is
well above an untrained drafter's."""

import json

import pytest
import torch
from flashfleet_trainer.cli import main
from flashfleet_trainer.drafter import DFlashDrafter, load_drafter
from flashfleet_trainer.evaluate import load_prompts, speculative_tau
from flashfleet_trainer.target import HiddenStateProducer

pytestmark = pytest.mark.slow  # about 1.5 minutes on 2 cores


@pytest.fixture(scope="module")
def tiny35(tmp_path_factory, one_torch_thread):
    from flashfleet_trainer.tiny import build

    out = tmp_path_factory.mktemp("tiny35")
    build(out, seed=0, vocab=128, hidden=64, layers=4, steps=200, num_seqs=96, prompt_len=8, completion_len=24,
          num_eval=8, log=lambda s: None, arch="qwen3_5")
    return out


def test_dflash_tiny_writes_the_wrapped_sharded_layout(tiny35):
    cfg = json.loads((tiny35 / "model" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"] and "vision_config" in cfg
    assert cfg["text_config"]["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    index = json.loads((tiny35 / "model" / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) >= 2 and any(k.startswith("model.visual.") for k in index)
    assert json.loads((tiny35 / "tiny.json").read_text())["arch"] == "qwen3_5"


def test_a_drafter_trained_on_the_hybrid_target_is_accepted(tiny35, tmp_path, one_torch_thread, capsys):
    out = tmp_path / "run"
    drafter = ["--num-draft-layers", "2", "--drafter-layer-types", "sliding,full", "--sliding-window", "8",
               "--drafter-num-heads", "4", "--drafter-num-kv-heads", "2", "--drafter-head-dim", "16"]
    argv = ["--target-model", str(tiny35 / "model"), "--data-dir", str(tiny35 / "data"), "--output-dir", str(out),
            "--target-gpus", "cpu", "--drafter-gpus", "cpu", "--block-size", "4", *drafter, "--token-budget", "256",
            "--max-seq-len", "32", "--max-batch-size", "8", "--max-anchors", "16", "--lr", "3e-3",
            "--warmup-ratio", "0.1", "--max-steps", "150", "--eval-num-prompts", "8", "--eval-max-new-tokens", "16",
            "--log-interval", "1000"]
    assert main([*argv, "--check"]) == 0
    assert "vision tower, MTP) never read" in capsys.readouterr().out
    assert main(argv) == 0
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    tau = [r for r in recs if "tau" in r][-1]["tau"]
    steps = [r for r in recs if "tau" not in r]
    assert steps[-1]["loss"] < steps[0]["loss"]
    ckpt = sorted((out / "checkpoints").glob("step-*"))[-1]
    trained = load_drafter(ckpt)
    assert trained.config.layer_types == ["sliding_attention", "full_attention"] and trained.config.sliding_window == 8
    # the baseline: the same architecture untrained
    torch.manual_seed(0)
    untrained = DFlashDrafter(trained.config).eval()
    producer = HiddenStateProducer(tiny35 / "model", ["cpu"], trained.config.target_layer_ids, "cpu")
    prompts = load_prompts(tiny35 / "data" / "eval" / "prompts.jsonl", 8)
    base = speculative_tau(producer, untrained, prompts, 4, 16)["tau"]
    print(f"hybrid tiny target: tau {tau:.3f} trained vs {base:.3f} untrained (block 4)")
    assert tau > 1.5 and tau > base + 0.5, (tau, base)

    # The drafter leaves the project for this target too: dflash-export reads the wrapped target's
    # text_config, and the exported directory (sliding layer included) gives the same tau and,
    # through z-lab's DFlashDraftModel, the same logits as the project's drafter on hybrid features.
    from flashfleet_trainer import export
    from flashfleet_trainer.evaluate import load_exported_drafter

    from tests.unit.test_export import _block_logits, _zlab

    exported = tmp_path / "drafter"
    assert export.main([str(out), str(exported)]) == 0
    cfg = json.loads((exported / "config.json").read_text())
    text = json.loads((tiny35 / "model" / "config.json").read_text())["text_config"]
    assert cfg["num_target_layers"] == text["num_hidden_layers"] and cfg["vocab_size"] == text["vocab_size"]
    assert cfg["layer_types"] == ["sliding_attention", "full_attention"]
    assert cfg["use_sliding_window"] is True and cfg["sliding_window"] == 8
    mine = load_exported_drafter(exported, tiny35 / "model")
    bf16 = load_drafter(ckpt)  # the checkpoint at the format's precision: what the export holds
    bf16.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in bf16.state_dict().items()})
    assert speculative_tau(producer, mine, prompts, 4, 16)["tau"] == speculative_tau(producer, bf16, prompts, 4, 16)["tau"]
    zlab = _zlab()
    model = zlab.DFlashDraftModel.from_pretrained(str(exported), dtype=torch.float32).eval()
    seq = prompts[0] + [5, 6, 7, 8, 9, 10]
    feats, _ = producer.forward(torch.tensor([seq]))
    embed, head = producer.embed_weight, producer.lm_head_weight
    for anchor in (5, len(seq) - 4):
        ids = torch.tensor([[seq[anchor]] + [cfg["dflash_config"]["mask_token_id"]] * 3])
        with torch.no_grad():
            hidden = model(position_ids=torch.arange(anchor + 4)[None], noise_embedding=embed[ids],
                           target_hidden=feats[:, :anchor])
        torch.testing.assert_close(hidden[0, 1:] @ head.T, _block_logits(mine, embed, head, feats[0], seq, anchor),
                                   atol=1e-4, rtol=1e-4)

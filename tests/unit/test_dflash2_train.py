"""dflash-train --drafter-kind dflash2 on the tiny assets: trains end to end on CPU, checkpoints,
resumes to the same weights as a straight run, logs the selector's metrics, and refuses early what
the peers refuse and a drafter of the other kind (resume, --init-from)."""

import json
import math

import pytest
import torch
from flashfleet.contract import metrics as contract
from flashfleet.contract.messages import EX_CONFIG
from flashfleet_trainer import export
from flashfleet_trainer.cli import main as train_main
from flashfleet_trainer.config import FIELDS, parse_args
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig
from flashfleet_trainer.launch import run
from safetensors.torch import load_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")

D2 = ("--drafter-kind", "dflash2", "--num-draft-layers", "2", "--target-layers", "1,2", "--selector-rank", "32")


def _unary(r) -> float:
    """The unary loss of a step's metrics under the default soft labels: (1 - w) CE + w T^2 KL."""
    w, t = FIELDS["kl_weight"].default, FIELDS["kl_temperature"].default
    return (1 - w) * r["ce"] + w * t * t * r["kl"]


def _refused(rc, capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EX_CONFIG and err and err[-1].startswith("flashfleet-train: config error: "), err
    assert "(fix: " in err[-1]
    return err[-1]


def test_dflash2_trains_checkpoints_and_resumes_to_the_straight_runs_weights(trainer_argv, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = (*D2, "--max-steps", "4", "--save-interval", "100")
    assert run(parse_args(trainer_argv(*common, out=straight)), log=lambda s: None) == 0

    def stop_at_2(trainer):
        if trainer.step == 2:
            trainer.request_stop()

    assert run(parse_args(trainer_argv(*common, out=split)), log=lambda s: None, on_step=stop_at_2) == 0
    logs = []
    assert run(parse_args(trainer_argv(*common, out=split)), log=logs.append) == 0
    assert any("resumed from" in s and "step-00000002" in s for s in logs)
    ckpt = straight / "checkpoints" / "step-00000004"
    cfg = json.loads((ckpt / "config.json").read_text())
    assert (cfg["drafter_kind"], cfg["conv_kernel_size"], cfg["conv_group_size"], cfg["selector_rank"],
            cfg["selector_top_k"]) == ("dflash2", 2, 16, 32, 16)
    a, b = load_file(str(ckpt / "drafter.safetensors")), load_file(str(split / "checkpoints" / "step-00000004" /
                                                                          "drafter.safetensors"))
    assert a.keys() == b.keys() and {"selector.predecessor_codebook", "layers.1.mlp_conv.base_kernel"} <= a.keys()
    for k in a:
        assert (a[k] - b[k]).abs().max().item() < 1e-5, k
    # trained: the convolutions left the identity and the selector's codebooks moved
    assert a["layers.0.attention_conv.kernel_projection.weight"].abs().max() > 0
    fresh = DFlashDrafter(DrafterConfig.from_dict(cfg))
    assert not torch.equal(fresh.state_dict()["layers.0.attention_conv.base_kernel"], a["layers.0.attention_conv.base_kernel"])
    steps = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if contract.is_step(r)]
    assert len(steps) == 4
    for r in steps:  # the selector's figures beside the unary ones; the loss holds both terms
        assert all(math.isfinite(r[k]) for k in contract.SELECTOR_KEYS), r
        assert 0 <= r["candidate_recall"] <= 1 and 0 <= r["selector_acc"] <= 1
        assert r["loss"] == pytest.approx(_unary(r) + r["selector_loss"], rel=1e-5)
    # the export of a trained DFlash 2 checkpoint is the DFlash 2 format
    out = export.export(straight, tmp_path / "exported", log=lambda s: None)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DFlash2DraftModel"]
    assert "DFlash2DraftModel" in export.check_export(out, 3)


def test_selector_loss_alpha_weighs_the_selector_term(trainer_argv, tmp_path):
    out = tmp_path / "a0"
    assert run(parse_args(trainer_argv(*D2, "--max-steps", "1", "--selector-loss-alpha", "0", out=out)),
               log=lambda s: None) == 0
    (r,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert r["loss"] == pytest.approx(_unary(r), rel=1e-5) and r["selector_loss"] > 0


def test_peers_refusals_come_first(trainer_argv, capsys):
    """What speculators, z-lab or vLLM would refuse is one line before the target loads: the
    tiny target's hidden size is 64, its vocabulary 128, the block 4."""
    for flags, what in ((("--conv-group-size", "24"), "does not divide the hidden size 64"),
                        (("--conv-kernel-size", "5"), "exceeds the block size 4"),
                        (("--selector-top-k", "200"), "exceeds the vocabulary of 128")):
        assert what in _refused(train_main(trainer_argv(*D2, *flags, "--check")), capsys)
    # the same settings are a DFlash run's to ignore
    assert train_main(trainer_argv("--conv-group-size", "24", "--check")) == 0


def _export_dir(tmp_path, trainer_tiny, kind) -> str:
    cfg = DrafterConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, num_hidden_layers=2, target_layer_ids=[1, 2], block_size=4, mask_token_id=127,
                        vocab_size=128, drafter_kind=kind, selector_rank=32, target_model=str(trainer_tiny / "model"))
    config, tensors = export.to_dflash(cfg, DFlashDrafter(cfg).state_dict(), export.target_facts(trainer_tiny / "model"))
    return str(export.write_dir(tmp_path / kind, config, tensors, "# test\n"))


def test_init_from_and_resume_refuse_the_other_kind(trainer_argv, trainer_tiny, tmp_path, capsys):
    from flashfleet_trainer.preflight import preflight

    dflash, dflash2 = _export_dir(tmp_path, trainer_tiny, "dflash"), _export_dir(tmp_path, trainer_tiny, "dflash2")
    base = ("--num-draft-layers", "2", "--target-layers", "1,2", "--max-steps", "1")
    line = _refused(train_main(trainer_argv(*base, "--drafter-kind", "dflash2", "--selector-rank", "32",
                                            "--init-from", dflash, out=tmp_path / "r1")), capsys)
    assert "a DFlash drafter (DFlashDraftModel) and this run builds DFlash 2" in line and "--drafter-kind dflash" in line
    line = _refused(train_main(trainer_argv(*base, "--init-from", dflash2, out=tmp_path / "r2")), capsys)
    assert "a DFlash 2 drafter (DFlash2DraftModel) and this run builds DFlash" in line
    assert "--drafter-kind dflash2" in line
    # the same kind and settings: accepted, and the weights are loaded before the first step
    args = parse_args(trainer_argv(*base, "--drafter-kind", "dflash2", "--selector-rank", "32", "--init-from", dflash2,
                                   out=tmp_path / "r3"))
    assert preflight(args).drafter_config.drafter_kind == "dflash2"
    line = _refused(train_main(trainer_argv(*base, "--drafter-kind", "dflash2", "--init-from", dflash2,
                                            out=tmp_path / "r4")), capsys)
    assert "selector_rank 32 there, 256 here" in line and "--selector-rank 32" in line
    # resuming a DFlash 2 checkpoint as DFlash (same output dir)
    assert train_main(trainer_argv(*base, "--drafter-kind", "dflash2", "--selector-rank", "32",
                                   out=tmp_path / "r5")) == 0
    capsys.readouterr()
    line = _refused(train_main(trainer_argv(*base, "--max-steps", "2", out=tmp_path / "r5")), capsys)
    assert "drafter_kind dflash2 there, dflash here" in line

"""The command line: the real run's flags, --config, and --check's exit 78 cases."""

import json
import os
import shlex
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flashfleet.contract.messages import EX_CONFIG
from flashfleet_trainer.cli import main
from flashfleet_trainer.config import build_parser, parse_args

INCIDENT = """--target-model /dev/shm/Qwen3.6-27B
  --data-dir /workspace/tokenized_completions --output-dir /workspace/checkpoints
  --target-gpus 0,1,2,3,4,5,6 --drafter-gpus 7 --epochs 6
  --lr 6e-4 --warmup-ratio 0.04 --weight-decay 0.01 --grad-accum 4 --grad-clip 1.0
  --token-budget 65536 --max-seq-len 8192 --max-batch-size 64
  --block-size 16 --max-anchors 512 --num-draft-layers 5
  --use-soft-labels --kl-temperature 2.0 --kl-weight 0.7 --streak-alpha 0.5
  --noise-start 0.1 --noise-end 0.01 --save-interval 2000
  --wandb-project dflash-qwen36-27b --wandb-run-name v2-kpro6-7x1-softKL-6ep"""


def test_the_real_runs_command_line_parses_with_its_meaning():
    a = parse_args(shlex.split(INCIDENT))
    assert (a.target_gpus, a.drafter_gpus, a.epochs, a.grad_accum, a.max_anchors) == ("0,1,2,3,4,5,6", "7", 6, 4, 512)
    assert a.use_soft_labels and a.kl_temperature == 2.0 and a.kl_weight == 0.7 and a.save_interval == 2000
    helptext = build_parser().format_help()
    for flag in {t for t in shlex.split(INCIDENT) if t.startswith("--")} | {"--max-steps", "--seed", "--resume",
                                                                              "--target-layers", "--check"}:
        assert flag in helptext
    assert "per MICRO-BATCH" in helptext  # what --max-anchors counts


def test_config_json_with_cli_override(tmp_path):
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"target_model": "/m", "data_dir": "/d", "output_dir": "/o", "use_soft_labels": True,
                               "target_gpus": "cpu", "lr": 1e-4, "block_size": 8}))
    a = parse_args(["--config", str(cfg), "--lr", "2e-4"])
    assert a.use_soft_labels and a.target_gpus == "cpu" and a.block_size == 8 and a.lr == 2e-4


def _check(argv, capsys):
    rc = main([*argv, "--check"])
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err


def test_check_ok(trainer_argv, capsys):
    assert main([*trainer_argv(), "--check"]) == 0
    assert "check: ok" in capsys.readouterr().out


def test_check_missing_model_dir(trainer_argv, tmp_path, capsys):
    argv = trainer_argv()
    argv[argv.index("--target-model") + 1] = str(tmp_path / "nope")
    rc, err = _check(argv, capsys)
    assert rc == EX_CONFIG and len(err) == 1 and err[0].startswith("flashfleet-train: config error: --target-model")
    assert "(fix: " in err[0]


def test_check_bad_data_schema(trainer_argv, tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"input_ids": ["not", "tokens"]}), bad / "x.parquet")
    argv = trainer_argv()
    argv[argv.index("--data-dir") + 1] = str(bad)
    rc, err = _check(argv, capsys)
    assert rc == EX_CONFIG and len(err) == 1 and "input_ids" in err[0] and "list<integer>" in err[0]


def test_check_too_many_gpus(trainer_argv, capsys):
    import torch

    n = torch.cuda.device_count()
    rc, err = _check([*trainer_argv(), "--target-gpus", ",".join(str(i) for i in range(n + 1))], capsys)
    assert rc == EX_CONFIG and len(err) == 1 and f"{n} CUDA device(s) are visible" in err[0]


def test_check_unknown_config_key(trainer_argv, tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"stats_sample_rate": 1}))
    rc, err = _check([*trainer_argv(), "--config", str(cfg)], capsys)
    assert rc == EX_CONFIG and "stats_sample_rate" in err[0]


def test_check_rejected_wandb_setting_offline_subprocess(trainer_argv, tmp_path):
    """The incident: a private wandb setting the installed wandb rejects. A real process, offline."""
    pytest.importorskip("wandb")
    import importlib.metadata as md

    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    argv = [*trainer_argv(), "--wandb-project", "p", "--wandb-settings", '{"_stats_sample_rate_seconds": 1}',
            "--check"]
    r = subprocess.run([sys.executable, "-m", "flashfleet_trainer.cli", *argv], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == EX_CONFIG, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashfleet-train: config error: wandb setting")
    assert "stats_sample_rate_seconds" in lines[0]
    assert f"wandb {md.version('wandb')}" in lines[0] and f"pydantic {md.version('pydantic')}" in lines[0]
    # a public setting passes the same check
    argv[argv.index("--wandb-settings") + 1] = '{"x_label": "node0"}'
    r = subprocess.run([sys.executable, "-m", "flashfleet_trainer.cli", *argv], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr

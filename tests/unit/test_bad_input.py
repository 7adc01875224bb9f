"""Bad input is refused at --check, before the target loads, in one line, with nothing changed.

Every case asserts the message, the exit status, and that the output directory (a sentinel file in
it) is exactly as it was. The NaN case runs the tiny target and asserts the last good checkpoint.
"""

import json
import math
import re

import pytest
from flashfleet.contract import messages
from flashfleet_trainer.checkpoint import complete_checkpoints
from flashfleet_trainer.cli import main
from flashfleet_trainer.config import EX_CONFIG, EX_NONFINITE, build_parser


def _tree(root):
    """Everything under root, with content and mtime: what "nothing changed" compares."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def out_dir(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "sentinel.txt").write_text("before\n")
    return out


def _refused(argv, capsys, out, code=EX_CONFIG):
    """Run `dflash-train ARGV --check`; return its one stderr line after checking rc and the tree."""
    before = _tree(out)
    rc = main([*argv, "--check"])
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert rc == code, (cap.out, cap.err)
    assert len(err) == 1, err
    assert messages.CONFIG_ERROR_RE.fullmatch(err[0]) and "(fix: " in err[0]
    assert "check: ok" not in cap.out
    assert _tree(out) == before
    return err[0]


# (extra flags, what the one line must say). One line per refused mistake.
NUMBERS = [
    (["--log-interval", "0"], "--log-interval 0: must be >= 1"),  # was ZeroDivisionError after step 1
    (["--weight-decay", "-1"], "--weight-decay -1.0: must be >= 0"),  # was torch's traceback
    (["--decay-gamma", "0"], "--decay-gamma 0.0: must be > 0"),  # was a run to NaN
    (["--lr", "-1e-3"], "--lr -0.001: must be in (0, 1)"),  # was argparse exit 2
    (["--lr", "0"], "--lr 0.0: must be in (0, 1)"),
    (["--lr", "5"], "--lr 5.0: must be in (0, 1)"),
    (["--lr", "nan"], "--lr nan is not a finite number"),
    (["--epochs", "inf"], "--epochs inf is not a finite number"),
    (["--epochs", "0"], "--epochs 0.0: must be > 0"),
    (["--warmup-ratio", "1"], "--warmup-ratio 1.0: must be in [0, 1)"),
    (["--warmup-ratio", "-0.1"], "--warmup-ratio -0.1: must be in [0, 1)"),
    (["--grad-accum", "0"], "--grad-accum 0: must be >= 1"),
    (["--grad-clip", "-1"], "--grad-clip -1.0: must be >= 0"),
    (["--seed", "-1"], "--seed -1: must be >= 0"),
    (["--max-steps", "0"], "--max-steps 0: must be >= 1"),
    (["--save-interval", "0"], "--save-interval 0: must be >= 1"),
    (["--keep-checkpoints", "-1"], "--keep-checkpoints -1: must be >= 0"),
    (["--token-budget", "1"], "--token-budget 1: must be >= 2"),
    (["--max-seq-len", "1"], "--max-seq-len 1: must be >= 2"),
    (["--max-seq-len", "512"], "--max-seq-len 512 exceeds --token-budget 256"),
    (["--max-batch-size", "0"], "--max-batch-size 0: must be >= 1"),
    (["--max-anchors", "0"], "--max-anchors 0: must be >= 1"),
    (["--block-size", "1"], "--block-size 1: must be >= 2"),
    (["--num-draft-layers", "0"], "--num-draft-layers 0: must be >= 1"),
    (["--mask-token-id", "-1"], "--mask-token-id -1: must be >= 0"),
    (["--sliding-window", "0"], "--sliding-window 0: must be >= 1"),
    (["--drafter-num-heads", "0"], "--drafter-num-heads 0: must be >= 1"),
    (["--drafter-num-kv-heads", "-2"], "--drafter-num-kv-heads -2: must be >= 1"),
    (["--drafter-head-dim", "0"], "--drafter-head-dim 0: must be >= 1"),
    (["--drafter-intermediate-size", "0"], "--drafter-intermediate-size 0: must be >= 1"),
    (["--kl-temperature", "0"], "--kl-temperature 0.0: must be > 0"),
    (["--kl-weight", "1.5"], "--kl-weight 1.5: must be in [0, 1]"),
    (["--streak-alpha", "-0.5"], "--streak-alpha -0.5: must be in [0, 1]"),
    (["--noise-start", "-0.1"], "--noise-start -0.1: must be >= 0"),
    (["--noise-end", "-1"], "--noise-end -1.0: must be >= 0"),
    (["--eval-num-prompts", "-1"], "--eval-num-prompts -1: must be >= 0"),
    (["--eval-max-new-tokens", "0"], "--eval-max-new-tokens 0: must be >= 1"),
    (["--node-timeout", "0"], "--node-timeout 0.0: must be > 0"),
    (["--rdzv-timeout", "-5"], "--rdzv-timeout -5.0: must be > 0"),
    (["--queue-depth", "-1"], "--queue-depth -1: must be >= 0"),
    (["--plan-steps", "0"], "--plan-steps 0: must be >= 1"),
    (["--nnodes", "0"], "--nnodes 0: must be >= 1"),
    (["--node-rank", "-1"], "--node-rank -1 is not in 0..0"),
]

ARGPARSE = [
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--lr", "fast"], "argument --lr: invalid float value: 'fast'"),
    (["--grad-accum", "1.5"], "argument --grad-accum: invalid int value: '1.5'"),
    (["--attn-impl", "sparse"], "argument --attn-impl: invalid choice: 'sparse'"),
    (["--lr"], "argument --lr: expected one argument"),
]


@pytest.mark.parametrize(("extra", "says"), NUMBERS + ARGPARSE, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_bad_flag_is_one_line_exit_78_nothing_changed(extra, says, trainer_argv, out_dir, capsys):
    line = _refused(trainer_argv(*extra, out=out_dir), capsys, out_dir)
    assert says in line, line


@pytest.mark.parametrize(("values", "says"), [
    ({"grad_clip": [1.0]}, "--grad-clip [1.0] is not a number"),
    ({"grad_clip": True}, "--grad-clip True is not a number"),
    ({"max_steps": 2.5}, "--max-steps 2.5 is not an integer"),
    ({"save_interval": "x"}, "invalid int value: 'x'"),
    ({"attn_impl": "sparse"}, "--attn-impl 'sparse' is not one of auto, dense, flex"),
    ({"weight_decay": -0.5}, "--weight-decay -0.5: must be >= 0"),
])
def test_bad_config_json_value(values, says, trainer_argv, out_dir, tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(values))
    line = _refused([*trainer_argv(out=out_dir), "--config", str(cfg)], capsys, out_dir)
    assert says in line, line


def test_negative_values_of_the_right_range_still_parse_and_help_states_ranges(trainer_argv, out_dir):
    from flashfleet_trainer.config import parse_args

    a = parse_args(trainer_argv("--lr", "1e-3", "--node-rank", "0", "--grad-clip", "0", out=out_dir))
    assert a.lr == 1e-3 and a.grad_clip == 0.0
    helptext = " ".join(build_parser().format_help().split())
    for rule in ("in (0, 1)", "in [0, 1)", "w in [0, 1]", "(>= 0; 0 = off)", "(0 = keep all)", "N >= 1 steps",
                 "(> 0)", "must exist when given", "65 the loss"):
        assert rule in helptext, rule


def test_missing_eval_prompts_is_refused(trainer_argv, out_dir, tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    line = _refused(trainer_argv("--eval-prompts", str(missing), out=out_dir), capsys, out_dir)
    assert f"--eval-prompts {missing}: no such file" in line


def test_nonfinite_loss_stops_without_saving_it(trainer_argv, tmp_path, monkeypatch, capsys):
    """Weights turned NaN after step 2 (saved): step 3's loss is NaN -> exit 65, step-2 stays newest."""
    import torch
    from flashfleet_trainer import trainer as tr

    original = tr.Trainer.train_step

    def train_step(self):
        if self.step == 2:
            with torch.no_grad():
                next(self.drafter.parameters()).fill_(float("nan"))
        return original(self)

    monkeypatch.setattr(tr.Trainer, "train_step", train_step)
    out = tmp_path / "run"
    rc = main(trainer_argv("--max-steps", "5", "--save-interval", "2", out=out))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EX_NONFINITE == messages.EX_NONFINITE == 65
    m = messages.NONFINITE_RE.match(err[-1])
    assert m and m.group(2) == "3", err
    st = json.loads((out / "status.json").read_text())
    assert st["phase"] == "failed" and st["last_error"] == err[-1] and st["step"] == 3
    ckpts = complete_checkpoints(out / "checkpoints")
    assert [p.name for p in ckpts] == ["step-00000002"]
    assert st["newest_checkpoint"] == str(ckpts[-1])
    assert not list((out / "checkpoints").glob("*3*"))
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [1, 2] and all(math.isfinite(r["loss"]) for r in steps)


def test_nonfinite_message_contract():
    line = messages.nonfinite_loss(7, float("inf"), "grad norm")
    assert messages.NONFINITE_RE.match(line).groups() == ("grad norm", "7")
    assert not messages.CONFIG_ERROR_RE.match(line) and not messages.PEER_FAILURE_RE.match(line)
    assert "\n" not in line and "(fix: " in line


# ---- the offline tools ---------------------------------------------------------------------------

def test_classify_refuses_empty_dir_and_non_object_evidence(tmp_path, capsys):
    from flashfleet import classify

    empty = tmp_path / "empty"
    empty.mkdir()
    assert classify.main([str(empty)]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "no evidence.json" in err and "fix:" in err and len(err.strip().splitlines()) == 1
    host = tmp_path / "run" / "gpu01"
    host.mkdir(parents=True)
    (host / "evidence.json").write_text("[1, 2]")
    assert classify.main([str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert str(host / "evidence.json") in err and "not an object" in err and "Traceback" not in err
    (host / "evidence.json").write_bytes(b"\xff\xfe{")
    assert classify.main([str(host / "evidence.json")]) == 1
    assert "cannot read evidence" in capsys.readouterr().err


def test_report_refuses_empty_or_non_run_dir_and_survives_non_utf8_metrics(tmp_path, capsys):
    from flashfleet import report

    empty = tmp_path / "empty"
    (empty / "stray").mkdir(parents=True)
    (empty / "stray" / "notes.txt").write_text("x")
    assert report.main([str(empty)]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "not a run directory" in err and "fix:" in err
    assert not (empty / "report.html").exists()
    assert report.main([str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    host = tmp_path / "run" / "gpu01"
    host.mkdir(parents=True)
    good = json.dumps({"step": 1, "loss": 2.0, "lr": 1e-4})
    (host / "metrics.jsonl").write_bytes(good.encode() + b"\n\xff\xfe garbage \x80\n")
    (host / "status.json").write_bytes(b"\xff\xfe")
    assert report.main([str(tmp_path / "run")]) == 0
    assert re.search(r"report\.html$", capsys.readouterr().out.strip())
    assert (tmp_path / "run" / "report.html").is_file()

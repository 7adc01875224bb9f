"""Bad input is refused at --check, before the target loads, in one line, with nothing changed.

Every case asserts the message, the exit status, and that the output directory (a sentinel file in
it) is exactly as it was. The NaN case runs the tiny target and asserts the last good checkpoint.
"""

import json
import math
import re
from pathlib import Path

import pytest
from flashfleet.contract import messages
from flashfleet.contract.messages import EX_CONFIG, EX_NONFINITE
from flashfleet_trainer.checkpoint import complete_checkpoints
from flashfleet_trainer.cli import main
from flashfleet_trainer.config import build_parser


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
    (["--server-gpus", "0"], "--server-gpus 0: must be >= 1 (fix: pass each vLLM server's tensor-parallel x"),
    (["--nnodes", "0"], "--nnodes 0: must be >= 1"),
    (["--node-rank", "-1"], "--node-rank -1 is not in 0..0"),
]

# --teacher-fp8 (the fused loss's FP8 teacher GEMM): refused where it cannot run or would do nothing.
FP8 = [
    (["--teacher-fp8", "--no-use-soft-labels"], "--teacher-fp8 with --no-use-soft-labels: a CE-only run computes no "
                                                "teacher logits"),
    (["--teacher-fp8", "--kl-weight", "0"], "--teacher-fp8 with --kl-weight 0: a CE-only run"),
    (["--teacher-fp8"], "--teacher-fp8 with a CPU drafter: the FP8 teacher GEMM is an option"),
]

# vLLM serves a drafter's target layers sorted and distinct (target.LAYER_RULE): a repeat or a
# reversed pair trains a drafter vLLM refuses or feeds in the wrong order.
LAYERS = [
    (["--target-layers", "2,1", "--num-draft-layers", "2"], "--target-layers 2,1: target layer ids [2, 1] are not "
                                                            "strictly ascending: vLLM serves"),
    (["--target-layers", "1,1", "--num-draft-layers", "2"], "fix: --target-layers 1 (each layer once, in order)"),
    (["--num-draft-layers", "4"], "a target of 4 decoder layers is too shallow for 4 draft layers"),
]

SERVER_CHECK = [
    (["--server-check-every", "-1"], "--server-check-every -1: must be >= 0"),
    (["--server-check-every", "2"], "--server-check-every 2 without --target-servers: there is no server to check"),
]

ARGPARSE = [
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--lr", "fast"], "argument --lr: invalid float value: 'fast'"),
    (["--grad-accum", "1.5"], "argument --grad-accum: invalid int value: '1.5'"),
    (["--attn-impl", "sparse"], "argument --attn-impl: invalid choice: 'sparse'"),
    (["--lr"], "argument --lr: expected one argument"),
]


@pytest.mark.parametrize(("extra", "says"), NUMBERS + FP8 + LAYERS + SERVER_CHECK + ARGPARSE, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
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
    for rule in ("(in (0, 1))", "(in [0, 1))", "(in [0, 1])", "(>= 0; 0 = off)", "(>= 0; 0 = keep all)", "(>= 1)",
                 "(> 0)", "must exist when given", "65 the loss"):
        assert rule in helptext, rule


def test_teacher_fp8_needs_a_hidden_size_of_a_multiple_of_16():
    from types import SimpleNamespace

    from flashfleet_trainer.errors import ConfigError
    from flashfleet_trainer.preflight import preflight_teacher_fp8

    args = SimpleNamespace(teacher_fp8=True, use_soft_labels=True, kl_weight=0.7, loss_impl="auto")
    with pytest.raises(ConfigError, match=r"the head is \[258, 40\], and FP8 GEMMs need the hidden size 40 to be"):
        preflight_teacher_fp8(args, 258, 40, ["cuda:0"])  # a byte vocabulary is padded, a hidden size cannot be
    assert preflight_teacher_fp8(SimpleNamespace(teacher_fp8=False), 258, 64, ["cpu"]) is None


def test_missing_eval_prompts_is_refused(trainer_argv, out_dir, tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    line = _refused(trainer_argv("--eval-prompts", str(missing), out=out_dir), capsys, out_dir)
    assert f"--eval-prompts {missing}: no such file" in line


def test_nonfinite_loss_stops_without_saving_it(trainer_argv, tmp_path, monkeypatch, capsys):
    """Weights turned NaN after step 2 (saved): step 3's loss is NaN -> exit 65, step-2 stays newest."""
    import torch
    from flashfleet_trainer import trainer as tr

    original = tr.Trainer.launch_step

    def launch_step(self):
        if self.step == 2:
            with torch.no_grad():
                next(self.drafter.parameters()).fill_(float("nan"))
        return original(self)

    monkeypatch.setattr(tr.Trainer, "launch_step", launch_step)
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


# ---- what --check reads before the target loads (and a real start refuses the same way) --------

@pytest.fixture
def no_target_load(monkeypatch):
    """Any load of the target fails the test: every refusal below must come before it."""
    from flashfleet_trainer import trainer
    from flashfleet_trainer.target import HiddenStateProducer

    def load(*_a, **_k):
        raise AssertionError("the target was loaded before the refusal")

    monkeypatch.setattr(HiddenStateProducer, "__init__", load)
    monkeypatch.setattr(trainer, "load_frozen_io", load)  # where the trainer looks it up


def _both_refuse(argv, capsys, roots, says):
    """--check and a real start (same preflight) refuse ARGV: one line saying `says`, exit 78,
    nothing under any of ROOTS changed (no file, no directory, no status.json), no target load."""
    before = {str(r): _tree(r) for r in roots}
    for extra in (["--check"], []):
        rc = main([*argv, *extra])
        cap = capsys.readouterr()
        err = cap.err.strip().splitlines()
        assert rc == EX_CONFIG, (extra, cap.out, cap.err)
        assert len(err) == 1 and messages.CONFIG_ERROR_RE.fullmatch(err[0]) and "(fix: " in err[0], err
        assert says in err[0], err[0]
        assert "check: ok" not in cap.out and "Traceback" not in cap.err
        assert {str(r): _tree(r) for r in roots} == before, extra
    return err[0]


@pytest.fixture
def model_copy(trainer_tiny, tmp_path):
    import shutil

    return Path(shutil.copytree(trainer_tiny / "model", tmp_path / "model"))


@pytest.fixture
def previous_run(tmp_path):
    """An output dir holding the evidence of an earlier run's death: a refused start keeps it."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "status.json").write_text(json.dumps({"phase": "failed", "step": 7, "last_error": "the last death"}))
    (out / "metrics.jsonl").write_text('{"step": 7, "loss": 1.0}\n')
    return out


def test_truncated_target_shard(trainer_argv, model_copy, previous_run, trainer_tiny, capsys, no_target_load):
    shard = sorted(model_copy.glob("*.safetensors"))[0]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 10)  # a copy that stopped early
    argv = trainer_argv(out=previous_run)
    argv[argv.index("--target-model") + 1] = str(model_copy)
    line = _both_refuse(argv, capsys, [model_copy, trainer_tiny / "data", previous_run], f"shard {shard.name}: ")
    assert "re-stage the model" in line


def _data(tmp_path, rows, masks=None, stats=True):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "data"
    d.mkdir()
    cols = {"input_ids": pa.array(rows, pa.list_(pa.int32()))}
    if masks is not None:
        cols["loss_mask"] = pa.array(masks, pa.list_(pa.int8()))
    pq.write_table(pa.table(cols), d / "train-00000.parquet", write_statistics=stats)
    return d


def _with_data(argv, d):
    argv = list(argv)
    argv[argv.index("--data-dir") + 1] = str(d)
    return argv


@pytest.mark.parametrize("stats", [True, False], ids=["statistics", "read"])
def test_token_id_at_or_above_vocab(trainer_argv, trainer_tiny, previous_run, tmp_path, capsys, no_target_load, stats):
    rows = [list(range(10)), [1, 2, 128, 3]]  # the tiny target's vocab is 128
    d = _data(tmp_path, rows, [[1] * 10, [1] * 4], stats=stats)
    line = _both_refuse(_with_data(trainer_argv(out=previous_run), d), capsys,
                        [trainer_tiny / "model", d, previous_run], "token id 128 outside the target's vocab of 128")
    assert ("(Parquet column statistics of row group 0)" in line) if stats else ("row 1: token id 128" in line
                                                                                 and "(read)" in line)
    assert "tokenize with the target model's tokenizer" in line


def test_negative_token_id(trainer_argv, trainer_tiny, previous_run, tmp_path, capsys, no_target_load):
    d = _data(tmp_path, [[1, 2, 3], [4, -1, 5]], stats=False)
    _both_refuse(_with_data(trainer_argv(out=previous_run), d), capsys, [trainer_tiny / "model", d, previous_run],
                 "row 1: token id -1 outside the target's vocab of 128 (read)")


@pytest.mark.parametrize(("mask", "says"), [([1, 1, 1], "row 1: loss_mask has 3 entries, input_ids 4"),
                                            (None, "row 1: loss_mask has no value entries, input_ids 4")])
def test_loss_mask_length_differs(trainer_argv, trainer_tiny, previous_run, tmp_path, capsys, no_target_load,
                                  mask, says):
    d = _data(tmp_path, [[1, 2, 3, 4, 5], [1, 2, 3, 4]], [[0, 0, 1, 1, 1], mask])
    line = _both_refuse(_with_data(trainer_argv(out=previous_run), d), capsys,
                        [trainer_tiny / "model", d, previous_run], says)
    assert "write one loss_mask entry per token" in line


def test_data_check_says_how_it_checked(trainer_argv, trainer_tiny, tmp_path, capsys, monkeypatch):
    """Statistics answer the token range; loss_mask lengths are read, within a budget it names."""
    from flashfleet_trainer import preflight

    assert main(trainer_argv("--check")) == 0
    out = capsys.readouterr().out
    assert "token ids" in out and "< vocab 128 (Parquet column statistics)" in out
    assert "full scan of loss_mask lengths: all 48 rows" in out
    monkeypatch.setattr(preflight, "SCAN_BUDGET_TOKENS", 1)
    d = _data(tmp_path, [[1, 2, 3]] * 5, [[1, 1, 1]] * 5, stats=False)
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(d / "train-00000.parquet"), d / "train-00000.parquet", row_group_size=1,
                   write_statistics=False)
    assert main(_with_data(trainer_argv("--check"), d)) == 0
    out = capsys.readouterr().out
    assert "(read from the data)" in out and "bounded scan of loss_mask lengths and ids: 1 of 5 rows read" in out


def test_wandb_without_credentials_is_refused_before_anything_is_written(trainer_argv, trainer_tiny, previous_run,
                                                                           tmp_path, capsys, monkeypatch,
                                                                           no_target_load):
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DISABLED", "WANDB_BASE_URL", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine example.org login u password p\n")
    monkeypatch.setenv("NETRC", str(netrc))
    argv = trainer_argv("--wandb-project", "dflash", out=previous_run)
    line = _both_refuse(argv, capsys, [trainer_tiny / "model", trainer_tiny / "data", previous_run],
                        "--wandb-project dflash: no wandb credentials (no $WANDB_API_KEY, no api.wandb.ai entry in")
    assert "WANDB_MODE=offline" in line and not list(previous_run.glob("wandb*"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main([*argv, "--check"]) == 0
    assert "wandb mode offline: no credentials needed" in capsys.readouterr().out
    monkeypatch.delenv("WANDB_MODE")
    netrc.write_text("machine api.wandb.ai login user password k3y\n")
    assert main([*argv, "--check"]) == 0
    assert f"wandb credentials: {netrc} entry for api.wandb.ai" in capsys.readouterr().out


@pytest.mark.parametrize(("targets", "drafters", "shared"), [("0,1", "1", "1"), ("0", "0,1", "0"),
                                                             ("0,1,2", "2,1", "2,1")])
def test_target_and_drafter_gpus_overlap(trainer_argv, trainer_tiny, previous_run, capsys, no_target_load,
                                         targets, drafters, shared):
    argv = trainer_argv(out=previous_run)
    argv[argv.index("--target-gpus") + 1], argv[argv.index("--drafter-gpus") + 1] = targets, drafters
    line = _both_refuse(argv, capsys, [trainer_tiny / "model", trainer_tiny / "data", previous_run],
                        f"--drafter-gpus {drafters} overlaps --target-gpus {targets} on GPU(s) {shared}")
    assert "GPUs of their own" in line


# ---- checkpoints in the output dir -----------------------------------------------------------

@pytest.fixture(scope="module")
def trained(trainer_tiny, tmp_path_factory):
    """A run of 2 steps with a checkpoint at each (the module's tests copy it)."""
    from flashfleet_trainer.config import parse_args
    from flashfleet_trainer.launch import run

    out = tmp_path_factory.mktemp("trained") / "run"
    argv = ["--target-model", str(trainer_tiny / "model"), "--data-dir", str(trainer_tiny / "data"),
            "--output-dir", str(out), "--target-gpus", "cpu", "--drafter-gpus", "cpu", "--block-size", "4",
            "--num-draft-layers", "1", "--token-budget", "256", "--max-seq-len", "32", "--max-batch-size", "8",
            "--max-anchors", "16", "--lr", "1e-3", "--eval-num-prompts", "0", "--max-steps", "2",
            "--save-interval", "1"]
    assert run(parse_args(argv), log=lambda s: None) == 0
    return out


@pytest.fixture
def run_copy(trained, tmp_path):
    import shutil

    return Path(shutil.copytree(trained, tmp_path / "run"))


def test_resume_path_without_marker_is_refused(trainer_argv, trainer_tiny, run_copy, capsys, no_target_load):
    from flashfleet.contract import checkpoint as contract

    step2 = run_copy / "checkpoints" / "step-00000002"
    (step2 / contract.MARKER).unlink()  # the save was killed before its last write
    line = _both_refuse(trainer_argv("--resume", str(step2), out=run_copy), capsys,
                        [trainer_tiny / "model", trainer_tiny / "data", run_copy],
                        f"--resume {step2} is not a complete checkpoint (no COMPLETE marker")
    assert "--resume auto" in line


def test_resume_path_with_truncated_weights_is_refused(trainer_argv, trainer_tiny, run_copy, capsys, no_target_load):
    step1 = run_copy / "checkpoints" / "step-00000001"
    w = step1 / "drafter.safetensors"
    with open(w, "r+b") as f:
        f.truncate(w.stat().st_size - 4)
    _both_refuse(trainer_argv("--resume", str(step1), out=run_copy), capsys,
                 [trainer_tiny / "model", trainer_tiny / "data", run_copy],
                 f"--resume {step1} is not a complete checkpoint (drafter.safetensors: ")


@pytest.mark.parametrize(("extra", "says"), [
    (["--num-draft-layers", "2"], "has a different drafter (num_hidden_layers 1 there, 2 here"),
    (["--block-size", "8"], "block_size 4 there, 8 here"),
    (["--drafter-intermediate-size", "32"], "intermediate_size"),
    (["--grad-accum", "2"], "was trained with 1 micro-batches per optimizer step (--grad-accum 1 x 1 drafter rank(s)), "
                            "this run takes 2"),
])
def test_resume_into_another_drafter_or_step_size_is_refused(trainer_argv, trainer_tiny, run_copy, capsys,
                                                             no_target_load, extra, says):
    _both_refuse(trainer_argv(*extra, out=run_copy), capsys, [trainer_tiny / "model", trainer_tiny / "data", run_copy],
                 says)


def test_check_names_the_resume_point_and_a_corrupt_newest_is_moved_aside_at_start(trainer_argv, run_copy, capsys):
    """--check names what a start will do (and changes nothing); the start moves the corrupt newest
    aside with a warning line, resumes from the one before, and keeps the bad one's bytes."""
    from flashfleet.contract import checkpoint as contract

    ck = run_copy / "checkpoints"
    argv = trainer_argv("--max-steps", "3", "--save-interval", "1", out=run_copy)
    assert main([*argv, "--check"]) == 0
    assert f"checkpoints: resumes from {ck / 'step-00000002'} (step 2; verified" in capsys.readouterr().out
    w = ck / "step-00000002" / "drafter.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF
    w.write_bytes(bytes(data))
    before = _tree(run_copy)
    assert main([*argv, "--check"]) == 0
    out = capsys.readouterr().out
    assert f"WARNING checkpoint {ck / 'step-00000002'} is not complete (drafter.safetensors: sha256 differs" in out
    assert "moves it aside to step-00000002.corrupt-1" in out
    assert f"resumes from {ck / 'step-00000001'} (step 1" in out
    assert _tree(run_copy) == before
    assert main(argv) == 0
    cap = capsys.readouterr()
    warn = [x for x in cap.err.splitlines() if x.startswith(messages.WARNING_PREFIX)]
    assert len(warn) == 1 and "step-00000002" in warn[0] and "moved aside to step-00000002.corrupt-1" in warn[0]
    assert f"resumed from {ck / 'step-00000001'}" in cap.out
    assert (ck / "step-00000002.corrupt-1" / "drafter.safetensors").read_bytes() == bytes(data)
    assert contract.quarantined(ck) == ["step-00000002.corrupt-1"]
    assert [p.name for p in complete_checkpoints(ck)] == ["step-00000001", "step-00000002", "step-00000003"]


def test_kill_mid_prune_is_cleaned_at_the_next_start(trainer_argv, run_copy, capsys):
    """What a kill during pruning leaves (the renamed old checkpoint, half deleted, of a dead pid)
    is removed by the next start, which resumes from the newest and prunes atomically."""
    import os
    import subprocess
    import sys

    from flashfleet.contract import checkpoint as contract

    ck = run_copy / "checkpoints"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    trash = ck / contract.trash_dir_name(1, dead.pid)
    os.rename(ck / "step-00000001", trash)
    (trash / "drafter.safetensors").unlink()
    assert main(trainer_argv("--max-steps", "4", "--save-interval", "1", "--keep-checkpoints", "2", out=run_copy)) == 0
    cap = capsys.readouterr()
    assert f"removed {trash}" in cap.out and f"resumed from {ck / 'step-00000002'}" in cap.out
    assert sorted(p.name for p in ck.iterdir()) == ["step-00000003", "step-00000004"]


def test_nonfinite_loss_in_a_multi_process_run_exits_65(trainer_argv, run_copy, capsys):
    """Two target workers feeding a drafter rank process: the rank resumes NaN weights (a checkpoint
    sealed again after the damage, so it verifies), its first step's loss is NaN: the rank exits 65,
    the node exits 65 (not 1) naming it, status.json keeps the rank's line, nothing is saved."""
    import torch
    from flashfleet.contract import checkpoint as contract
    from safetensors.torch import load_file, save_file

    ck = run_copy / "checkpoints" / "step-00000002"
    w = load_file(str(ck / "drafter.safetensors"))
    save_file({k: torch.full_like(v, float("nan")) for k, v in w.items()}, str(ck / "drafter.safetensors"))
    contract.write_manifest(ck, 2)
    argv = trainer_argv("--max-steps", "4", "--save-interval", "1", out=run_copy)
    argv[argv.index("--target-gpus") + 1] = "cpu,cpu"
    rc = main(argv)
    cap = capsys.readouterr()
    assert rc == EX_NONFINITE, cap.err
    node_line = [x for x in cap.err.splitlines() if x.startswith(messages.ERROR_PREFIX + "node 0:")]
    assert node_line and "drafter rank 0 stopped on a non-finite loss" in node_line[-1], cap.err
    st = json.loads((run_copy / "status.json").read_text())
    m = messages.NONFINITE_RE.match(st["last_error"])
    assert st["phase"] == "failed" and m and m.group(2) == "3", st
    assert [p.name for p in complete_checkpoints(run_copy / "checkpoints")] == ["step-00000001", "step-00000002"]


@pytest.mark.parametrize(("extra", "says"), [
    (["--log-interval", "0"], "--log-interval 0: must be >= 1"),
    (["--lr", "-1e-3"], "--lr -0.001: must be in (0, 1)"),
    (["--eval-prompts", "/nonexistent/prompts.jsonl"], "no such file"),
    (["--wandb-settings", "{not json"], "--wandb-settings is not JSON"),
    (["--resume", "/nonexistent/step-00000001"], "not auto, never, or an existing checkpoint directory"),
])
def test_a_refused_real_start_keeps_the_previous_status_and_writes_nothing(trainer_argv, trainer_tiny, previous_run,
                                                                          capsys, no_target_load, extra, says):
    status = (previous_run / "status.json").read_bytes()
    _both_refuse(trainer_argv(*extra, out=previous_run), capsys,
                 [trainer_tiny / "model", trainer_tiny / "data", previous_run], says)
    assert (previous_run / "status.json").read_bytes() == status


def test_a_refused_start_creates_no_output_dir(trainer_argv, tmp_path, capsys, no_target_load):
    out = tmp_path / "new" / "run"
    assert main(trainer_argv("--log-interval", "0", out=out)) == EX_CONFIG
    capsys.readouterr()
    assert not (tmp_path / "new").exists()

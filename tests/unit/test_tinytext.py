"""dflash-tiny-text: the real-text tiny target (Python stdlib source, bytes), its cache, and the
guard it makes testable: labels shifted by one position give tau near 1 while the training
accuracy is high, and the interval evaluation says so."""

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from flashfleet.contract import metrics as contract
from flashfleet_trainer import tinytext
from flashfleet_trainer.cli import main as train_main
from flashfleet_trainer.trainer import Trainer

from tests.conftest import ROOT

SCRIPT = ROOT / "platform" / "tiny-assets.sh"


# ---- the sources, the tokens ---------------------------------------------------------------------

def test_sources_split_by_file_and_hashed():
    files = tinytext.sources()
    assert [f["path"] for f in files] == sorted(tinytext.SOURCES)
    held = [f for f in files if f["split"] == "heldout"]
    assert len(held) == len(files) // tinytext.HELD_OUT_EVERY and {f["split"] for f in files} == {"train", "heldout"}
    import hashlib
    import sysconfig

    first = Path(sysconfig.get_paths()["stdlib"]) / files[0]["path"]
    assert files[0]["sha256"] == hashlib.sha256(first.read_bytes()).hexdigest()


def test_missing_source_is_named(tmp_path):
    for name in sorted(tinytext.SOURCES)[:-1]:
        (tmp_path / name).write_text("x = 1\n")
    with pytest.raises(FileNotFoundError, match=sorted(tinytext.SOURCES)[-1]):
        tinytext.sources(tmp_path)


def test_bytes_round_trip_and_leave_pad_and_mask_rows_free():
    text = "def f(x):\n    return x  # é\n"
    ids = tinytext.encode(text.encode())
    assert ids.min() >= 1 and ids.max() <= 256 < tinytext.VOCAB - 1  # 0 = pad, VOCAB-1 = the mask row
    assert tinytext.decode_ids(ids.tolist()) == text


# ---- the cache (a copy of the script in a scratch tree, a stand-in builder) ----------------------

def _scratch_tree(tmp_path):
    root = tmp_path / "repo"
    for rel in ("platform/tiny-assets.sh", "trainer/flashfleet_trainer/tiny.py",
                "trainer/flashfleet_trainer/tinytext.py", "requirements/controller.lock"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    fake = tmp_path / "fake-tiny-text"
    # the stand-in: --list-sources prints what the real one would; a build writes tiny.json (its
    # arguments in it) into its last argument and counts itself
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --list-sources ]; then cat \"$SOURCES_FILE\"; exit 0; fi\n"
                    "for a; do out=$a; done\n"
                    "mkdir -p \"$out\" && echo \"{\\\"args\\\": \\\"$*\\\"}\" > \"$out/tiny.json\" && echo built >> \"$BUILDS\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return root, fake


def test_text_assets_cached_by_recipe_seed_and_sources(tmp_path):
    root, fake = _scratch_tree(tmp_path)
    sources, builds = tmp_path / "sources", tmp_path / "builds"
    sources.write_text("aaa argparse.py train\n")
    env = {**os.environ, "DFLASH_TINY_TEXT": str(fake), "SOURCES_FILE": str(sources), "BUILDS": str(builds)}

    def assets(*args):
        r = subprocess.run(["bash", str(root / "platform/tiny-assets.sh"), *args], env=env, capture_output=True,
                           text=True, check=True)
        return Path(r.stdout.strip())

    first = assets("0", "text")
    assert first.parent == root / ".cache" and first.name.startswith("tiny-text-") and (first / "tiny.json").is_file()
    assert assets("0", "text") == first and builds.read_text().count("built") == 1  # cached
    assert assets("1", "text") != first  # the seed
    sources.write_text("bbb argparse.py train\n")
    assert assets("0", "text") != first  # another interpreter's stdlib text
    sources.write_text("aaa argparse.py train\n")
    with open(root / "trainer/flashfleet_trainer/tinytext.py", "a") as f:
        f.write("# a changed recipe\n")
    assert assets("0", "text") != first
    hybrid = assets("0", "text-hybrid")  # the same text on the hybrid layout: its own folder
    assert hybrid.name.startswith("tiny-text-hybrid-") and hybrid.parent == first.parent
    assert json.loads((hybrid / "tiny.json").read_text())["args"].startswith("--arch qwen3_5 --seed 0 ")
    assert builds.read_text().count("built") == 5
    bad = subprocess.run(["bash", str(root / "platform/tiny-assets.sh"), "0", "prose"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown kind 'prose' (fix: pass phrase, hybrid, text or text-hybrid)" in bad.stderr


# ---- the real assets (built once per content, minutes; reused from the cache) --------------------

@pytest.fixture(scope="session")
def text_tiny():
    r = subprocess.run(["bash", str(SCRIPT), "0", "text"], capture_output=True, text=True, check=True)
    return Path(r.stdout.strip())


@pytest.mark.slow
def test_text_assets_layout_and_held_out_prompts(text_tiny):
    info = json.loads((text_tiny / "tiny.json").read_text())
    assert info["kind"] == "text" and [f["path"] for f in info["sources"]] == sorted(tinytext.SOURCES)
    assert info["heldout_lm_loss"] < 3.0 < np.log(256)  # learned something (uniform bytes: 5.5 nats)
    table = pq.read_table(sorted((text_tiny / "data").glob("train-*.parquet"))[0]).to_pylist()
    assert len(table) == info["num_sequences"]
    row = table[0]
    assert len(row["input_ids"]) == len(row["loss_mask"]) == info["prompt_len"] + info["completion_len"]
    assert row["loss_mask"] == [0] * info["prompt_len"] + [1] * info["completion_len"]
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = {s: b"".join((stdlib / f["path"]).read_bytes() for f in info["sources"] if f["split"] == s)
            for s in ("train", "heldout")}
    prompts = [json.loads(line) for line in (text_tiny / "data/eval/prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == info["num_eval"] and {p["set"] for p in prompts} == {tinytext.EVAL_SET}
    for p in prompts:
        b = tinytext.decode_ids(p["input_ids"]).encode()
        assert b in text["heldout"]
    # the training prompts are cut from the training files
    assert all(tinytext.decode_ids(r["input_ids"][:info["prompt_len"]]).encode() in text["train"] for r in table[:20])


def _train(text_tiny, tmp_path, name, steps=60):
    out = tmp_path / name
    argv = ["--target-model", str(text_tiny / "model"), "--data-dir", str(text_tiny / "data"), "--output-dir",
            str(out), "--target-gpus", "cpu", "--drafter-gpus", "cpu", "--block-size", "4", "--num-draft-layers", "1",
            "--token-budget", "1024", "--max-seq-len", "128", "--max-batch-size", "8", "--max-anchors", "128",
            "--lr", "3e-3", "--warmup-ratio", "0.05", "--max-steps", str(steps), "--eval-interval", str(steps // 2),
            "--eval-interval-prompts", "6", "--eval-num-prompts", "0", "--eval-max-new-tokens", "24",
            "--eval-temperature", "1", "--ce-target", "data",  # the data's bytes, which LABEL_SHIFT moves,
            "--no-use-soft-labels",  # and the CE alone (the teacher's distribution is not shifted)
            "--resume", "never", "--log-interval", "20"]
    assert train_main(argv) == 0
    evals = [r for r in contract.read(out / "metrics.jsonl") if not contract.is_step(r)]
    assert [r["eval"] for r in evals] == ["interval"]
    return evals[0]


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_shifted_labels_give_tau_near_1_and_the_evaluation_says_so(text_tiny, tmp_path, capsys, monkeypatch):
    """Interval evaluations at temperature 1: this small target's greedy continuations loop on one
    byte (`self.______`), which a drafter copying its anchor guesses, so greedy hides the gap."""
    healthy = _train(text_tiny, tmp_path, "aligned")
    printed = capsys.readouterr().out
    assert healthy[contract.TAU_GAP_WARNING] is None and "likely cause: labels shifted" not in printed
    # served about as often as right in training: far from the guard's ratio, whatever its accuracy
    assert healthy["accept_rate"][0] >= Trainer.TAU_GAP_RATIO * healthy[contract.TRAIN_ACC1] > 0

    monkeypatch.setattr(Trainer, "LABEL_SHIFT", 1)
    shifted = _train(text_tiny, tmp_path, "shifted")
    printed = capsys.readouterr().out
    # the training accuracy is high (position 1 learns to copy the anchor it is given) ...
    assert shifted[contract.TRAIN_ACC1] >= Trainer.TAU_GAP_MIN_ACC > healthy[contract.TRAIN_ACC1]
    assert shifted[contract.TRAIN_TAU] > healthy[contract.TRAIN_TAU]
    # ... and tau is near 1: only runs of one byte (indentation) are accepted, below what training implies
    assert shifted["accept_rate"][0] < Trainer.TAU_GAP_RATIO * shifted[contract.TRAIN_ACC1]
    assert shifted["tau_pooled"] < min(2.0, shifted[contract.TRAIN_TAU])
    warning = shifted[contract.TAU_GAP_WARNING]
    assert warning and "likely cause: labels shifted or misaligned" in warning
    assert warning in printed

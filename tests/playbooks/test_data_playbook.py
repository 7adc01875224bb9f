"""data.yml through ansible-runner, on this machine with the local connection: a run's conversations
become its data directory's Parquet (dflash-data build with the target's tokenizer and chat
template), which dflash-train --check then passes; a second run leaves it alone; conversations
without an answer fail with dflash-data's own line. (regenerate itself is tested against a real
vLLM server in tests/unit/test_data_regenerate.py.)
"""

import json
import sys
from pathlib import Path

import pytest

from tests.chat_tokenizer import make_tokenizer, write_jsonl
from tests.conftest import ROOT, failure_messages

TRAINER = {"target_gpus": "cpu", "drafter_gpus": "cpu", "block_size": 4, "num_draft_layers": 1,
           "token_budget": 256, "max_seq_len": 64, "max_batch_size": 8, "max_anchors": 16, "eval_num_prompts": 0}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from flashfleet_trainer.tiny import build

    out = tmp_path_factory.mktemp("tiny-chat")
    build(out, seed=0, vocab=512, hidden=64, layers=4, steps=2, num_seqs=4, prompt_len=4, completion_len=4,
          num_eval=1, log=lambda s: None)
    return make_tokenizer(out / "model")


def _inventory(tmp_path: Path, target: Path) -> Path:
    chats = write_jsonl(tmp_path / "chats.jsonl", [
        {"conversations": [{"from": "human", "value": f"x = {i}"}, {"from": "gpt", "value": f"y = x + {i}"}]}
        for i in range(6)])
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    runs = {name: {"hosts": ["here"], "data": {"input": [str(src)], "max_len": 64, "shard_rows": 4},
                   "trainer": {**TRAINER, "target_model": str(target), "data_dir": str(tmp_path / name / "data")}}
            for name, src in (("chat", chats), ("prompts", prompts))}
    inv = tmp_path / "hosts.json"
    inv.write_text(json.dumps({"all": {"vars": {"flashfleet_runs": runs}, "children": {"gpu_nodes": {"hosts": {"here": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "flashfleet_venv": str(Path(sys.executable).parent.parent), "flashfleet_runs_root": str(tmp_path / "runs"),
        "training_data_poll_s": 1}}}}}}))
    return inv


def _task(runner, name):
    return next(ev["event_data"]["res"] for ev in runner.events
                if ev.get("event") in ("runner_on_ok", "runner_on_failed") and ev["event_data"].get("task") == name)


@pytest.mark.slow
def test_data_yml_builds_the_runs_data_checks_it_and_keeps_it(tmp_path, run_playbook, target):
    inv = _inventory(tmp_path, target)
    r = run_playbook(ROOT / "data.yml", inv, run="chat")
    assert r.rc == 0, r.stdout.read()
    data = tmp_path / "chat" / "data"
    assert sorted(p.name for p in data.iterdir()) == ["build.json", "part-00000.parquet", "part-00001.parquet"]
    assert json.loads((data / "build.json").read_text())["rows"] == 6
    assert any("build: 6 rows" in line for line in _task(r, "Fail with dflash-data's own words")["msg"])
    assert _task(r, "Fail with the trainer's own words")["msg"] == "check: ok"  # dflash-train --check's last line

    again = run_playbook(ROOT / "data.yml", inv, run="chat")
    assert again.rc == 0 and not _task(again, "Make the data with the target's chat template (dflash-data)")["changed"]

    bad = run_playbook(ROOT / "data.yml", inv, run="prompts")
    assert bad.rc != 0
    (msg,) = failure_messages(bad)
    assert "dflash-data failed (exit 78)" in msg and "has an assistant turn" in msg, msg
    assert not (tmp_path / "prompts" / "data").exists() or not list((tmp_path / "prompts" / "data").glob("*"))

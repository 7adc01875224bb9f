"""dflash-data regenerate against a real vLLM server (vLLM's CPU build, tests/vllm_server.py) serving
a tiny Qwen3 target, with the test's tokenizer and Qwen3-style chat template saved beside it:

- a run SIGKILLed in the middle and started again answers every prompt exactly once (the ledger),
  asking the server only for what was missing, and builds rows of the exact tokens;
- a server that answers another model, or none, is refused in one line before anything is written.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from flashfleet.contract.messages import EX_CONFIG
from flashfleet_trainer.data import INPUT_IDS, LOSS_MASK, load_data
from flashfleet_trainer.data_cli import main
from transformers import AutoTokenizer

from tests.chat_tokenizer import make_tokenizer, write_jsonl
from tests.vllm_server import VllmServer, need_vllm

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 512  # the tokenizer's 400 tokens fit the target's vocabulary
N = 60


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """The tiny Qwen3 target with 32-wide heads (vLLM's CPU attention) and the test tokenizer."""
    from flashfleet_trainer.tiny import build

    out = tmp_path_factory.mktemp("tiny-chat")
    build(out, seed=0, vocab=VOCAB, hidden=128, layers=2, steps=5, num_seqs=8, prompt_len=8, completion_len=8,
          num_eval=1, log=lambda s: None)
    make_tokenizer(out / "model")
    return out / "model"


@pytest.fixture(scope="module")
def server(target, tmp_path_factory):
    need_vllm()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    s = VllmServer(target, None, None, None, log, max_model_len=256, extract=False)
    try:
        yield s.start()
    finally:
        s.stop()


def conversations(n):
    """Prompts of several shapes: ShareGPT with an old answer (replaced), OpenAI messages, a system turn."""
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append({"conversations": [{"from": "human", "value": f"def f{i}(x):"},
                                          {"from": "gpt", "value": "an answer by another model"}]})
        elif i % 3 == 1:
            out.append({"messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": f"import os as o{i}"}]})
        else:
            out.append({"messages": [{"role": "user", "content": f"x = {i}"}]})
    return out


def regen_argv(target, server_url, src, out, *extra):
    return ["regenerate", "--model", str(target), "--server", server_url, "--input", str(src), "--out", str(out),
            "--max-tokens", "24", "--temperature", "0.8", "--concurrency", "2", "--progress-s", "0.5", *extra]


def _ledger_lines(path):
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_a_killed_regenerate_resumes_and_every_prompt_is_answered_exactly_once(target, server, tmp_path, capsys):
    src = write_jsonl(tmp_path / "prompts.jsonl", conversations(N))
    out = tmp_path / "data"
    ledger = out / "regenerate" / "responses.jsonl"
    cmd = [sys.executable, "-m", "flashfleet_trainer.data_cli", *regen_argv(target, server.url, src, out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while _ledger_lines(ledger) < 10:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "slow"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        first = proc.communicate()[0]
    done_before = _ledger_lines(ledger)
    assert 10 <= done_before < N, (done_before, first)
    while server.requests_in_flight():  # what the killed run had asked is finished or dropped
        time.sleep(0.1)
    served_before = server.requests_served()

    assert main(regen_argv(target, server.url, src, out)) == 0
    text = capsys.readouterr().out
    assert f"{N} prompt(s), {done_before} answered before, {N - done_before} to ask" in text, text
    assert f"regenerate: {N - done_before}/{N - done_before} answered (100%)" in text  # the last progress line
    # Nothing asked twice: the missing answers and the start's one-token vocabulary probe.
    assert server.requests_served() - served_before == N - done_before + 1
    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    ids = [r["id"] for r in records]
    assert sorted(ids) == sorted(f"prompts.jsonl:{i}" for i in range(N)) and len(set(ids)) == N  # once each

    settings = json.loads((out / "regenerate" / "settings.json").read_text())
    assert (settings["temperature"], settings["max_tokens"], settings["top_p"]) == (0.8, 24, 0.95)
    assert settings["stop_token_ids"] == [2] and settings["max_model_len"] == 256
    # Rows are the exact tokens: the template's prompt, then the answer as sampled (all supervised).
    tok = AutoTokenizer.from_pretrained(str(target))
    by_id = {r["id"]: r for r in records}
    convs = conversations(N)
    table = pq.read_table(sorted(out.glob("*.parquet"))[0])
    rows = list(zip(table.column(INPUT_IDS).to_pylist(), table.column(LOSS_MASK).to_pylist(), strict=True))
    assert len(rows) == N and "build: 60 rows from 60 conversation(s)" in text
    for i in (0, 1, 2):
        rec = by_id[f"prompts.jsonl:{i}"]
        msgs = rec["messages"][:-1]
        assert msgs[-1]["content"] == (convs[i].get("messages") or [{"content": f"def f{i}(x):"}])[-1]["content"]
        want = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, enable_thinking=True)
        assert rec["prompt_ids"] == want["input_ids"]
        assert 1 <= len(rec["completion_ids"]) <= 24
        row = rec["prompt_ids"] + rec["completion_ids"]
        assert (row, [0] * len(rec["prompt_ids"]) + [1] * len(rec["completion_ids"])) in rows
    assert len(load_data(out, max_seq_len=256, vocab_size=VOCAB)) == N

    # The built directory is refused before the server is asked anything.
    served_before = server.requests_served()
    assert main(regen_argv(target, server.url, src, out)) == EX_CONFIG
    assert "already holds 1 Parquet file(s)" in capsys.readouterr().err
    assert server.requests_served() == served_before
    # Its ledger with other sampling settings is refused, not mixed.
    for f in out.glob("*.parquet"):
        f.unlink()
    assert main(regen_argv(target, server.url, src, out, "--temperature", "0.1")) == EX_CONFIG
    err = capsys.readouterr().err
    assert "was started with other settings (temperature 0.8 now 0.1)" in err


def test_a_server_of_another_model_is_refused_in_one_line_and_nothing_is_written(target, server, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(target, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "hidden_size": 256}))
    src = write_jsonl(tmp_path / "prompts.jsonl", conversations(3))
    assert main(regen_argv(other, server.url, src, tmp_path / "data")) == EX_CONFIG
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--server {server.url} answers another model" in err[0], err
    assert "hidden_size 128" in err[0] and "hidden_size 256" in err[0]
    assert not (tmp_path / "data").exists()

    assert main(regen_argv(target, "http://127.0.0.1:9", src, tmp_path / "data")) == EX_CONFIG
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--server http://127.0.0.1:9: no answer" in err[0], err
    assert not (tmp_path / "data").exists()

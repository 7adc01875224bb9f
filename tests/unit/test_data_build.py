"""dflash-data build: conversations -> the trainer's Parquet through a real tokenizer and chat template.

The tokenizer is trained in the test (tests/chat_tokenizer.py) and carries a Qwen3-style template;
rows are compared with transformers' own apply_chat_template(tokenize=True), and every token's mask
is checked: the rows are cut into runs of equal mask and each run's decoded text is spelled out.
"""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flashfleet.contract.messages import EX_CONFIG
from flashfleet_trainer.data import INPUT_IDS, LOSS_MASK, check_schema, load_data
from flashfleet_trainer.data_cli import main
from transformers import AutoTokenizer

from tests.chat_tokenizer import make_tokenizer, write_jsonl

SYSTEM = {"role": "system", "content": "You are terse."}
TWO_TURNS = [SYSTEM, {"role": "user", "content": "def f(x): return x"},
             {"role": "assistant", "content": "<think>\nit returns x\n</think>\n\nimport os\nprint(os)"},
             {"role": "user", "content": "and a class?"},
             {"role": "assistant", "content": "<think>one line</think>class A: pass"}]
SHAREGPT = {"id": "sg-1", "conversations": [{"from": "human", "value": "for i in range(3):"},
                                            {"from": "gpt", "value": "    print(i)"}]}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tok(model):
    return AutoTokenizer.from_pretrained(str(model))


def rows(out):
    check_schema(out)  # what dflash-train --check reads first
    t = pa.concat_tables([pq.read_table(f) for f in sorted(out.glob("*.parquet"))])
    return list(zip(t.column(INPUT_IDS).to_pylist(), t.column(LOSS_MASK).to_pylist(), strict=True))


def runs(tok, ids, mask):
    """[(mask value, decoded text)] of the row's maximal runs of equal mask: every token in one."""
    out = []
    for i, m in zip(ids, mask, strict=True):
        if out and out[-1][0] == m:
            out[-1][1].append(i)
        else:
            out.append((m, [i]))
    return [(m, tok.decode(t, skip_special_tokens=False)) for m, t in out]


def build(model, tmp_path, records, *flags, out="data"):
    src = write_jsonl(tmp_path / "convs.jsonl", records)
    return main(["build", "--model", str(model), "--input", str(src), "--out", str(tmp_path / out), *flags])


def test_each_assistant_turn_and_its_end_marker_are_supervised_and_nothing_else(model, tok, tmp_path, capsys):
    assert build(model, tmp_path, [{"id": "two", "messages": TWO_TURNS}, SHAREGPT]) == 0
    (ids, mask), (ids2, mask2) = rows(tmp_path / "data")
    # The rows are the template's own tokenization (thinking on, Qwen3's default).
    assert ids == tok.apply_chat_template(TWO_TURNS, tokenize=True, enable_thinking=True)["input_ids"]
    assert runs(tok, ids, mask) == [
        (0, "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\ndef f(x): return x<|im_end|>\n"
            "<|im_start|>assistant\n"),
        (1, "import os\nprint(os)<|im_end|>"),  # a history turn: the template drops its thinking
        (0, "\n<|im_start|>user\nand a class?<|im_end|>\n<|im_start|>assistant\n"),
        (1, "<think>\none line\n</think>\n\nclass A: pass<|im_end|>"),  # the last: thinking kept, supervised
        (0, "\n")]
    assert runs(tok, ids2, mask2) == [(0, "<|im_start|>user\nfor i in range(3):<|im_end|>\n<|im_start|>assistant\n"),
                                      (1, "<think>\n\n</think>\n\n    print(i)<|im_end|>"), (0, "\n")]
    out = capsys.readouterr().out
    assert "build: 2 rows from 2 conversation(s) in 1 shard(s)" in out and "dropped none" in out
    summary = json.loads((tmp_path / "data" / "build.json").read_text())
    assert summary["tokens"] == len(ids) + len(ids2) and summary["supervised_tokens"] == sum(mask) + sum(mask2)
    assert not (tmp_path / "data" / ".building").exists()


def test_strip_renders_with_thinking_off_and_the_empty_think_block_is_the_prompts(model, tok, tmp_path):
    assert build(model, tmp_path, [{"messages": TWO_TURNS}], "--thinking", "strip") == 0
    ((ids, mask),) = rows(tmp_path / "data")
    stripped = [m if m["role"] != "assistant" else {"role": "assistant", "content": c}
                for m, c in zip(TWO_TURNS, [None, None, "import os\nprint(os)", None, "class A: pass"], strict=True)]
    assert ids == tok.apply_chat_template(stripped, tokenize=True, enable_thinking=False)["input_ids"]
    assert [r for r in runs(tok, ids, mask) if r[0]] == [(1, "import os\nprint(os)<|im_end|>"),
                                                         (1, "class A: pass<|im_end|>")]
    assert runs(tok, ids, mask)[2] == (0, "\n<|im_start|>user\nand a class?<|im_end|>\n<|im_start|>assistant\n"
                                          "<think>\n\n</think>\n\n")  # what the server's prompt would hold


def test_per_turn_gives_each_assistant_turn_its_own_row_with_its_thinking(model, tok, tmp_path):
    assert build(model, tmp_path, [{"messages": TWO_TURNS}], "--per-turn") == 0
    (ids1, mask1), (ids2, mask2) = rows(tmp_path / "data")
    assert ids1 == tok.apply_chat_template(TWO_TURNS[:3], tokenize=True)["input_ids"]
    assert [t for m, t in runs(tok, ids1, mask1) if m] == ["<think>\nit returns x\n</think>\n\nimport os\nprint(os)<|im_end|>"]
    assert [t for m, t in runs(tok, ids2, mask2) if m] == ["<think>\none line\n</think>\n\nclass A: pass<|im_end|>"]


def test_cap_duplicates_shards_and_the_summary(model, tok, tmp_path, capsys):
    convs = [{"messages": [{"role": "user", "content": f"x = {i}"}, {"role": "assistant", "content": f"y = {i} * 2"}]}
             for i in range(5)]
    long = {"messages": [{"role": "user", "content": "z = 1"}, {"role": "assistant", "content": "w = 2 " * 40}]}
    prompt_only = {"messages": [{"role": "user", "content": "q"}]}
    huge_prompt = {"messages": [{"role": "user", "content": "import " * 60}, {"role": "assistant", "content": "ok"}]}
    assert build(model, tmp_path, [*convs, convs[0], long, prompt_only, huge_prompt],
                 "--max-len", "40", "--shard-rows", "2") == 0
    out = tmp_path / "data"
    assert sorted(p.name for p in out.glob("*.parquet")) == ["part-00000.parquet", "part-00001.parquet",
                                                           "part-00002.parquet"]
    got = rows(out)
    assert len(got) == 6 and max(len(i) for i, _ in got) == 40  # the long answer truncated, still supervised
    summary = json.loads((out / "build.json").read_text())
    assert summary["dropped"] == {"exact duplicate": 1, "no assistant turn": 1, "nothing supervised within --max-len": 1}
    assert summary["truncated"] == 2 and summary["length"]["max"] == 40
    text = capsys.readouterr().out
    assert "build: 2 row(s) truncated to --max-len 40" in text
    assert "1 (exact duplicate)" in text and "1 (no assistant turn)" in text
    data = load_data(out, max_seq_len=64, vocab_size=len(tok))  # the trainer reads it as written
    assert len(data) == 6 and int(data.mask.sum()) == summary["supervised_tokens"]


def test_parquet_input_is_read_like_jsonl(model, tmp_path):
    src = tmp_path / "convs.parquet"
    pq.write_table(pa.Table.from_pylist([SHAREGPT]), src)
    assert main(["build", "--model", str(model), "--input", str(src), "--out", str(tmp_path / "data")]) == 0
    assert len(rows(tmp_path / "data")) == 1


def _refused(capsys, rc):
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EX_CONFIG and len(err) == 1, err
    return err[0]


def test_bad_input_is_refused_in_one_line_and_nothing_is_written(model, tmp_path, capsys):
    bare = make_tokenizer(tmp_path / "bare", template=None)
    line = _refused(capsys, build(bare, tmp_path, [SHAREGPT]))
    assert "the tokenizer has no chat template" in line and "fix: use the target's own tokenizer" in line

    prompts = [{"messages": [{"role": "user", "content": "hello"}]}] * 3
    line = _refused(capsys, build(model, tmp_path, prompts))
    assert "none of the 3 conversation(s) has an assistant turn" in line and "dflash-data regenerate" in line

    line = _refused(capsys, build(model, tmp_path, [{"messages": TWO_TURNS}], "--max-len", "8"))
    assert "the loss mask supervises nothing" in line and "raise --max-len" in line

    line = _refused(capsys, build(model, tmp_path, [{"messages": [{"role": "robot", "content": "x"}]}]))
    assert "message role 'robot'" in line
    assert not (tmp_path / "data").exists() or list((tmp_path / "data").iterdir()) == []

    assert build(model, tmp_path, [SHAREGPT]) == 0
    line = _refused(capsys, build(model, tmp_path, [SHAREGPT]))
    assert "already holds 1 Parquet file(s)" in line

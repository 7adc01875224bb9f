"""Prompt sets for dflash-eval: the JSONL format (token ids or chat messages, a set name) and tau per set."""

import json

import pytest
from flashfleet.contract.messages import EX_CONFIG
from flashfleet_trainer.evaluate import PromptError, load_prompt_sets
from flashfleet_trainer.evaluate import main as eval_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class FakeChatTokenizer:
    """Stands in for a target's tokenizer (the tiny target has none): one id per character."""

    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and tokenize
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return {"input_ids": [ord(c) % 100 for c in text]}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sets_ids_and_messages(tmp_path):
    a = _write(tmp_path / "a.jsonl", [{"set": "gsm8k", "input_ids": [1, 2, 3]}, {"set": "math", "input_ids": [4]},
                                      {"set": "gsm8k", "input_ids": [5, 6]}, {"set": "gsm8k", "input_ids": [7]}])
    b = _write(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    sets = load_prompt_sets([a, b], limit=2, tokenizer=lambda: FakeChatTokenizer())
    assert list(sets) == ["gsm8k", "math", "chat"]  # order of first appearance; no "set": the file's stem
    assert sets["gsm8k"] == [[1, 2, 3], [5, 6]] and sets["math"] == [[4]]  # at most `limit` per set
    assert sets["chat"] == [[ord(c) % 100 for c in "<user>hi<assistant>"]]


@pytest.mark.parametrize("line,needle", [
    ('{"set": "x"}', 'needs "input_ids" or "messages"'),
    ('{"input_ids": []}', "non-empty list of token ids"),
    ('{"input_ids": [1, -2]}', "non-empty list of token ids"),
    ('[1, 2]', "not a JSON object"),
    ('{"input_ids": [1], "set": ""}', '"set" must be a non-empty string'),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "no tokenizer with a chat template"),
    ('{"input_ids": [1]', "not JSON"),
])
def test_bad_lines_name_the_line(tmp_path, line, needle):
    f = tmp_path / "p.jsonl"
    f.write_text('{"input_ids": [1]}\n' + line + "\n")
    with pytest.raises(PromptError) as e:
        load_prompt_sets(f, tokenizer=lambda: None)
    assert needle in str(e.value)
    if "tokenizer" not in needle:
        assert e.value.what.startswith(f"{f}:2: ")
    assert "(fix: " in str(e.value)


def test_dflash_eval_reports_tau_per_set(trainer_tiny, tmp_path, capsys):
    ids = [json.loads(x)["input_ids"] for x in (trainer_tiny / "data" / "eval" / "prompts.jsonl").read_text().splitlines()]
    a = _write(tmp_path / "a.jsonl", [{"set": "one", "input_ids": ids[0]}, {"set": "two", "input_ids": ids[1]}])
    b = _write(tmp_path / "b.jsonl", [{"set": "two", "input_ids": ids[2]}])
    argv = ["--target-model", str(trainer_tiny / "model"), "--random-drafter", "--block-size", "4",
            "--num-draft-layers", "1", "--prompts", str(a), str(b), "--max-new-tokens", "8"]
    assert eval_main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["sets"]) == {"one", "two"}
    assert out["sets"]["one"]["prompts"] == 1 and out["sets"]["two"]["prompts"] == 2
    assert out["cycles"] == out["sets"]["one"]["cycles"] + out["sets"]["two"]["cycles"]
    assert out["tau_pooled"] == out["tau"] == out["tokens"] / out["cycles"]
    for s in out["sets"].values():
        assert s["tau_pooled"] == s["tokens"] / s["cycles"] and 1 <= s["tau_prompt_mean"] <= 4
    assert len(out["accept_rate"]) == 3
    # bad input: one config-error line, exit 78
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"set": "x"}\n')
    assert eval_main([*argv[:-4], str(bad)]) == EX_CONFIG
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{bad}:1" in err[0] and "(fix: " in err[0]
    assert eval_main([*argv, "--top-p", "0"]) == EX_CONFIG


def test_dflash_eval_takes_a_runs_config_and_writes_its_prompts(trainer_tiny, tmp_path, capsys):
    """--run-config RUN.json gives the target and the run's held-out prompts (as the trainer finds
    them); --prompts-out writes what was evaluated; a target too shallow for the random drafter's
    layers, or neither a target nor a run config, is one config-error line."""
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"target_model": str(trainer_tiny / "model"), "data_dir": str(trainer_tiny / "data")}))
    out = tmp_path / "prompts.json"
    argv = ["--run-config", str(run), "--random-drafter", "--block-size", "4", "--num-draft-layers", "1",
            "--num-prompts", "2", "--max-new-tokens", "4", "--prompts-out", str(out)]
    assert eval_main(argv) == 0
    ids = [json.loads(x)["input_ids"] for x in (trainer_tiny / "data" / "eval" / "prompts.jsonl").read_text().splitlines()]
    assert json.loads(out.read_text()) == ids[:2]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["prompts"] == 2
    assert eval_main([*argv, "--num-draft-layers", "4"]) == EX_CONFIG
    assert "too shallow for 4 draft layers" in capsys.readouterr().err
    assert eval_main(argv[2:]) == EX_CONFIG
    assert "--target-model and --prompts are needed" in capsys.readouterr().err

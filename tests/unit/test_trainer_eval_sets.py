"""Prompt sets for dflash-eval: the JSONL format (token ids or chat messages, a set name) and tau per set."""

import json

import pytest
from flashfleet.contract.messages import EX_CONFIG
from flashfleet_trainer.evaluate import PromptError, load_prompt_sets
from flashfleet_trainer.evaluate import main as eval_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class FakeChatTokenizer:
    """Stands in for a target's tokenizer (the tiny target has none): one id per character; with
    thinking off, a Qwen3-style empty think block after the generation prompt."""

    chat_template = "{{ messages }}{% if enable_thinking is false %}<think></think>{% endif %}"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, **kwargs):
        assert add_generation_prompt and tokenize
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        if "enable_thinking" in self.chat_template and kwargs.get("enable_thinking") is False:
            text += "<think></think>"
        return {"input_ids": [ord(c) % 100 for c in text]}


class NoSwitchTokenizer(FakeChatTokenizer):
    chat_template = "{{ messages }}"


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


def _ids(text):
    return [ord(c) % 100 for c in text]


def test_the_thinking_switch_renders_messages_and_is_recorded(tmp_path):
    """on (the default) leaves the template's generation prompt as it is, off passes
    enable_thinking=False; `info` records the switch only where a template read it."""
    chat = _write(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    ids = _write(tmp_path / "ids.jsonl", [{"input_ids": [1, 2]}])
    for thinking, tail in (("on", "<assistant>"), ("off", "<assistant><think></think>")):
        info = {}
        sets = load_prompt_sets([chat, ids], tokenizer=FakeChatTokenizer(), thinking=thinking, info=info)
        assert sets["chat"] == [_ids("<user>hi" + tail)] and info == {"thinking": thinking}
    info = {}
    load_prompt_sets(ids, tokenizer=FakeChatTokenizer(), thinking="off", info=info)
    assert info == {"thinking": None}  # token ids only: no template was asked
    load_prompt_sets(chat, tokenizer=NoSwitchTokenizer(), thinking="off", info=info)
    assert info == {"thinking": None}  # a template without the switch


def test_the_thinking_switch_with_a_qwen3_style_template(tmp_path):
    """A real tokenizer with Qwen3's generation-prompt logic: off ends the prompt with the empty
    think block, on does not."""
    from transformers import AutoTokenizer

    from tests.chat_tokenizer import make_tokenizer

    tok = AutoTokenizer.from_pretrained(str(make_tokenizer(tmp_path / "tok")))
    chat = _write(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "What is 2 + 2?"}]}])
    on = load_prompt_sets(chat, tokenizer=tok, thinking="on")["chat"][0]
    off = load_prompt_sets(chat, tokenizer=tok, thinking="off")["chat"][0]
    assert tok.decode(off).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.decode(on).endswith("<|im_start|>assistant\n") and off[:len(on)] == on


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
    # recorded with its settings: greedy, no top-p/top-k, token-id prompts (no thinking switch)
    for rec in (out, *out["sets"].values()):
        assert (rec["temperature"], rec["top_p"], rec["top_k"], rec["thinking"]) == (0.0, 1.0, 0, None)
    # bad input: one config-error line, exit 78
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"set": "x"}\n')
    assert eval_main([*argv[:-4], str(bad)]) == EX_CONFIG
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{bad}:1" in err[0] and "(fix: " in err[0]
    assert eval_main([*argv, "--top-p", "0"]) == EX_CONFIG
    assert eval_main([*argv, "--top-k", "-1"]) == EX_CONFIG
    assert "--eval-top-k -1: must be >= 0" in capsys.readouterr().err
    assert eval_main([*argv, "--thinking", "maybe"]) == EX_CONFIG
    assert "--thinking" in capsys.readouterr().err


def test_dflash_eval_records_sampling_and_thinking(trainer_tiny, tmp_path, capsys, monkeypatch):
    """--temperature/--top-p/--top-k/--thinking reach the prompts and the sampler, and the JSON
    line records each beside tau (overall and per set)."""
    from flashfleet_trainer import evaluate

    monkeypatch.setattr(evaluate, "_tokenizer_of", lambda target_model: FakeChatTokenizer())
    chat = _write(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    base = ["--target-model", str(trainer_tiny / "model"), "--random-drafter", "--block-size", "4",
            "--num-draft-layers", "1", "--prompts", str(chat), "--max-new-tokens", "6"]
    assert eval_main([*base, "--temperature", "1", "--top-p", "0.9", "--top-k", "5", "--thinking", "off"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for rec in (out, out["sets"]["chat"]):
        assert (rec["temperature"], rec["top_p"], rec["top_k"], rec["thinking"]) == (1.0, 0.9, 5, "off")
    assert eval_main(base) == 0  # the defaults: greedy, thinking on
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (out["temperature"], out["top_p"], out["top_k"], out["thinking"]) == (0.0, 1.0, 0, "on")


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

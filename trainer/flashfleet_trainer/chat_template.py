"""The target's own tokenizer and chat template: a conversation as token ids and a loss mask.

What the mask covers: for each supervised assistant turn, the tokens the target itself would
generate there, i.e. everything after the template's generation prompt (`<|im_start|>assistant\\n`
for ChatML, plus the empty `<think>\\n\\n</think>\\n\\n` a Qwen3-style template adds when thinking is
off) up to and including the template's end-of-turn marker (`<|im_end|>`), which is how a turn
stops. System and user turns, the generation prompts and the formatting after the end marker are
not supervised.

How it is found, for any template: the row is the template's own rendering T of the conversation
(transformers' apply_chat_template, tokenized as apply_chat_template(tokenize=True) does). Turn i
starts where the rendering of the conversation before it with the generation prompt stops agreeing
with T, and ends after the first end-of-turn marker from there (the marker is read off the template
by rendering a probe conversation). The row is kept only if tokenizing T piece by piece at those
boundaries gives exactly T's tokens: a boundary inside a token would supervise half a token, and a
prompt tokenized alone (what a server does) would not match the row.
"""

from __future__ import annotations

import os
from pathlib import Path

from flashfleet.plan.defaults import THINKING_SWITCH  # noqa: F401 (its owner; readers import it from here too)

from .errors import ConfigError

THINKING = ("keep", "strip")
# The thinking switch of an evaluation's prompts (dflash-eval --thinking, --eval-thinking): Qwen3.x
# templates read `enable_thinking` (off: an empty think block after the generation prompt), others
# ignore it. Default on: the published evaluations of the Qwen3.5/3.6/3.8 drafters run with
# thinking (z-lab's benchmark commands pass `--reasoning`/`--enable-thinking`; `dflash` 0.1.0's
# benchmark.py passes nothing by default, which those templates read as on). z-lab's Qwen3-4B/8B
# drafters are non-thinking: their published tau is with it off. Its values, THINKING_SWITCH, are
# flashfleet.plan.defaults' (the run's settings take their choices from there).


def thinking_kwargs(on: bool) -> dict:
    """apply_chat_template's keyword for the switch."""
    return {"enable_thinking": on}


def reads_thinking(tokenizer) -> bool:
    """Whether this tokenizer's chat template reads the switch at all."""
    return "enable_thinking" in str(getattr(tokenizer, "chat_template", None) or "")


class Drop(Exception):
    """This row is left out, for the reason given (counted in the build's summary)."""


class ChatTemplate:
    def __init__(self, model_dir, thinking: str = "keep"):
        from transformers import AutoTokenizer

        d = Path(model_dir)
        try:
            self.tok = AutoTokenizer.from_pretrained(str(d))
        except Exception as e:  # transformers says it many ways: no files, a config without a tokenizer
            raise ConfigError(f"--model {d}: no tokenizer could be loaded ({str(e).splitlines()[0][:200]})",
                              "point --model at the target's HF directory with its tokenizer files") from e
        if not getattr(self.tok, "chat_template", None):
            raise ConfigError(f"--model {d}: the tokenizer has no chat template",
                              "use the target's own tokenizer (its chat_template.jinja or tokenizer_config.json "
                              "chat_template); a base model's tokenizer cannot render conversations")
        if thinking not in THINKING:
            raise ConfigError(f"--thinking {thinking!r}", f"use one of {', '.join(THINKING)}")
        self.thinking = thinking
        self.kwargs = thinking_kwargs(thinking == "keep")
        self.model_dir = d
        self.end_of_turn = self._end_of_turn()

    # ---- rendering -----------------------------------------------------------------------------

    def prepare(self, messages: list[dict]) -> list[dict]:
        from .conversations import strip_thinking

        return strip_thinking(messages) if self.thinking == "strip" else messages

    def render(self, messages: list[dict], generation_prompt: bool = False) -> str:
        return self.tok.apply_chat_template(self.prepare(messages), tokenize=False,
                                            add_generation_prompt=generation_prompt, **self.kwargs)

    def encode(self, text: str) -> list[int]:
        # The template writes its own special tokens (BOS included where it has one).
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """What the target is asked with: the conversation so far and the generation prompt."""
        return self.encode(self.render(messages, generation_prompt=True))

    def _end_of_turn(self) -> str:
        probe = [{"role": "user", "content": "Ping"}, {"role": "assistant", "content": "Pong"}]
        try:
            text = self.render(probe)
        except Exception as e:
            raise ConfigError(f"--model {self.model_dir}: the chat template fails on a user and an assistant turn ({e})",
                              "use the target's own chat template") from e
        end = text[text.rfind("Pong") + len("Pong"):].strip()
        if "Pong" not in text or not end:
            raise ConfigError(f"--model {self.model_dir}: the chat template writes no end-of-turn marker after an "
                              "assistant turn, so a turn's end cannot be supervised",
                              "use the target's own chat-model template (e.g. ChatML's <|im_end|>)")
        return end

    @property
    def stop_token_ids(self) -> list[int]:
        """The tokens a generated turn ends with: the end-of-turn marker (one token) and EOS."""
        ids = set()
        marker = self.encode(self.end_of_turn)
        if len(marker) == 1:
            ids.add(marker[0])
        if self.tok.eos_token_id is not None:
            ids.add(int(self.tok.eos_token_id))
        return sorted(ids)

    @property
    def vocab_size(self) -> int:
        return len(self.tok)

    # ---- rows ----------------------------------------------------------------------------------

    def _render_or_drop(self, messages, generation_prompt=False) -> str:
        try:
            return self.render(messages, generation_prompt)
        except Exception as e:  # a template's own raise_exception (roles must alternate, ...)
            raise Drop(f"the chat template refused it ({str(e).splitlines()[0][:80]})") from e

    def row(self, messages: list[dict], supervise: list[int]) -> tuple[list[int], list[int]]:
        """(input_ids, loss_mask) of `messages` (ending in an assistant turn) with the assistant turns
        at indices `supervise` supervised."""
        text = self._render_or_drop(messages)
        cuts, pos = [], 0
        for i in supervise:
            if i == 0:
                raise Drop("an assistant turn comes first (nothing to answer)")
            before = self._render_or_drop(messages[:i])
            prompt = self._render_or_drop(messages[:i], generation_prompt=True)
            if not text.startswith(before):
                raise Drop("the template renders the history differently in a longer conversation (try --per-turn)")
            # A history turn may be rendered without what the generation prompt adds (Qwen3's empty
            # think block with thinking off): the turn starts where the two stop agreeing.
            start = len(prompt) if text.startswith(prompt) else len(os.path.commonprefix([text, prompt]))
            end = text.find(self.end_of_turn, start)
            if start < max(pos, len(before)) or end < 0:
                raise Drop("an assistant turn's span was not found in the rendering")
            end += len(self.end_of_turn)
            cuts.append((start, end))
            pos = end
        bounds = [0] + [b for c in cuts for b in c] + [len(text)]
        pieces = [text[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        ids, mask = [], []
        for k, piece_ids in enumerate(self.tok(pieces, add_special_tokens=False)["input_ids"]):
            ids += piece_ids
            mask += [k % 2] * len(piece_ids)  # pieces alternate: outside, turn, outside, turn, ..., outside
        if ids != self.encode(text):
            raise Drop("a turn boundary falls inside a token")
        return ids, mask

    def regenerated_row(self, messages: list[dict], prompt_ids: list[int],
                        completion_ids: list[int], where: str) -> tuple[list[int], list[int]]:
        """A regenerated answer's row: the exact prompt tokens sent and the exact tokens answered
        (never re-tokenized from text), the prompt checked against this template's rendering."""
        if list(prompt_ids) != self.prompt_ids(messages[:-1]):
            raise ConfigError(f"{where}: its prompt tokens are not this tokenizer's rendering of its conversation "
                              f"with --thinking {self.thinking}",
                              "build with the --model and --thinking the responses were regenerated with")
        return list(prompt_ids) + list(completion_ids), [0] * len(prompt_ids) + [1] * len(completion_ids)

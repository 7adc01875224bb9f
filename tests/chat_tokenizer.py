"""A small real tokenizer with a Qwen3-style chat template, for dflash-data's tests.

A byte-level BPE trained in about a second (the `tokenizers` library) on Python standard-library
source, which every machine with Python has, with ChatML's special tokens and <think>/</think>,
wrapped as a transformers PreTrainedTokenizerFast and saved with the template below: Qwen3's own
logic (ChatML turns; the thinking of the turns after the last user query kept as a <think> block,
the history's dropped; `enable_thinking=false` adds an empty think block to the generation prompt),
without the tool-calling parts.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

QWEN3_LIKE_TEMPLATE = """\
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in message.content %}
            {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
            {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""


def _stdlib_text(limit=400_000) -> list[str]:
    import json as stdlib_json  # any pure-Python standard-library package: its source is the text

    root = Path(stdlib_json.__file__).resolve().parents[1]
    out, n = [], 0
    for f in sorted(root.glob("*.py")):
        t = f.read_text(errors="replace")
        out.append(t)
        n += len(t)
        if n >= limit:
            break
    return out


def make_tokenizer(path, vocab_size: int = 400, template: str | None = QWEN3_LIKE_TEMPLATE) -> Path:
    """Train, wrap and save the tokenizer in `path` (no chat template with template=None)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_stdlib_text(), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    if template is not None:
        fast.chat_template = template
    path = Path(path)
    fast.save_pretrained(str(path))
    return path


def write_jsonl(path, records) -> Path:
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in records))
    return Path(path)

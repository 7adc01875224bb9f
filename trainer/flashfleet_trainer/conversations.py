"""Conversations in: ShareGPT and OpenAI-messages records from JSONL or Parquet, as one shape.

    ShareGPT        {"id"?: ..., "conversations": [{"from": "human"|"gpt"|"system"|..., "value": "..."}]}
    OpenAI messages {"id"?: ..., "messages": [{"role": "user"|"assistant"|"system", "content": "..."}]}

Every record becomes a `Conversation(id, messages)` with OpenAI roles; `id` is the record's own
`id` when it has one, else `<file name>:<record index>` (stable while the file is unchanged: the
regenerate ledger keys on it). A regenerated record (data_regenerate) also carries the exact
`prompt_ids` and `completion_ids` the target saw and produced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

# ShareGPT's speakers as OpenAI roles (the names the public ShareGPT-style sets use).
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "model": "assistant", "bard": "assistant", "bing": "assistant",
                  "system": "system", "tool": "tool", "function": "tool", "observation": "tool"}
ROLES = {"system", "user", "assistant", "tool"}
# A thinking block inside an assistant turn (Qwen3 / Qwen3.5 / Qwen3.6 and their peers).
THINK_RE = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


@dataclass
class Conversation:
    id: str
    messages: list[dict]
    prompt_ids: list[int] | None = None  # regenerated records only: the exact tokens sent ...
    completion_ids: list[int] | None = None  # ... and the exact tokens the target answered
    extra: dict = field(default_factory=dict)

    def assistant_turns(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]


def _text(content, where: str) -> str:
    """OpenAI content is a string or a list of parts; only text parts are training data."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type", "text") != "text" for p in content):
            raise ConfigError(f"{where}: a message has non-text parts ({sorted({p.get('type') for p in content})})",
                              "keep text-only conversations: the drafter is trained on the target's text")
        return "".join(str(p.get("text", "")) for p in content)
    raise ConfigError(f"{where}: message content of type {type(content).__name__}", "give content as a string")


def normalize(record: dict, where: str) -> list[dict]:
    """A record's messages as [{"role", "content"[, "reasoning_content"]}] with OpenAI roles."""
    if isinstance(record.get("messages"), list):
        out = []
        for m in record["messages"]:
            role = m.get("role") if isinstance(m, dict) else None
            if role not in ROLES:
                raise ConfigError(f"{where}: message role {role!r} is not one of {sorted(ROLES)}",
                                  "use OpenAI roles (system, user, assistant, tool)")
            msg = {"role": role, "content": _text(m.get("content"), where)}
            if m.get("reasoning_content"):
                msg["reasoning_content"] = str(m["reasoning_content"])
            out.append(msg)
        return out
    if isinstance(record.get("conversations"), list):
        out = []
        for m in record["conversations"]:
            who = str(m.get("from", "")).lower() if isinstance(m, dict) else ""
            if who not in SHAREGPT_ROLES:
                raise ConfigError(f"{where}: ShareGPT speaker {m.get('from') if isinstance(m, dict) else m!r} "
                                  f"is not one of {sorted(SHAREGPT_ROLES)}", "map it to human/gpt/system")
            out.append({"role": SHAREGPT_ROLES[who], "content": _text(m.get("value"), where)})
        return out
    raise ConfigError(f"{where}: neither `messages` (OpenAI) nor `conversations` (ShareGPT) "
                      f"(keys: {', '.join(sorted(record)) or 'none'})",
                      "give each record a `messages` or a `conversations` list")


def _records(path: Path) -> Iterator[tuple[int, dict]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        i = 0
        for batch in pf.iter_batches(batch_size=1024):
            for rec in batch.to_pylist():
                yield i, rec
                i += 1
        return
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path} line {i + 1} is not JSON ({e.msg})", "write one JSON object per line") from e
            if not isinstance(rec, dict):
                raise ConfigError(f"{path} line {i + 1} is not a JSON object", "write one JSON object per line")
            yield i, rec


def read_conversations(paths) -> Iterator[Conversation]:
    """Every record of every file (JSONL/JSON lines, or Parquet), in the order given."""
    for p in map(Path, paths):
        if not p.is_file():
            raise ConfigError(f"--input {p}: no such file", "give JSONL or Parquet files of conversations")
        for i, rec in _records(p):
            where = f"{p} record {i}"
            conv = Conversation(str(rec["id"]) if rec.get("id") is not None else f"{p.name}:{i}",
                                normalize(rec, where))
            if rec.get("prompt_ids") is not None:
                conv.prompt_ids, conv.completion_ids = list(rec["prompt_ids"]), list(rec["completion_ids"])
            yield conv


def strip_thinking(messages: list[dict]) -> list[dict]:
    """Assistant turns without their <think> blocks or reasoning_content (--thinking strip)."""
    out = []
    for m in messages:
        if m["role"] == "assistant":
            m = {"role": "assistant", "content": THINK_RE.sub("", m["content"]).lstrip("\n")}
        out.append(m)
    return out

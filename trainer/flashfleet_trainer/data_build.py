"""`dflash-data build`: conversations -> the trainer's Parquet (`input_ids`, `loss_mask`), in shards.

Rows: one per conversation (every assistant turn supervised), or with `per_turn` one per assistant
turn (the conversation up to that turn, only that turn supervised). A regenerated record
(data_regenerate) is one row of its exact prompt and answer tokens.
Length cap: rows longer than `max_len` are truncated, not dropped: the tokens kept are still the
target's own (the trainer cuts at --max-seq-len the same way), and dropping would bias the data
against long answers, reasoning traces first. A row with nothing supervised left is dropped.
Exact duplicates (same tokens and mask) are dropped after the first.
Output: `part-NNNNN.parquet` of `shard_rows` rows each, every shard written to a temporary name and
renamed; all of them wait in `OUT/.building/` and move into OUT only once the whole build passed,
then `build.json` (the summary). A refused build leaves OUT as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .chat_template import ChatTemplate, Drop
from .conversations import Conversation
from .data import INPUT_IDS, LOSS_MASK
from .errors import ConfigError

SUMMARY = "build.json"
STAGING = ".building"
SCHEMA = pa.schema([(INPUT_IDS, pa.list_(pa.int32())), (LOSS_MASK, pa.list_(pa.uint8()))])

NO_ASSISTANT = "no assistant turn"
NOTHING_SUPERVISED = "nothing supervised within --max-len"
DUPLICATE = "exact duplicate"


@dataclass
class BuildOptions:
    per_turn: bool = False
    max_len: int = 8192
    shard_rows: int = 10000
    dedup: bool = True


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardWriter:
    """Shards of at most `rows` rows into OUT/.building/, each atomically (temp + fsync + rename)."""

    def __init__(self, out: Path, rows: int):
        self.out, self.rows, self.staging = out, rows, out / STAGING
        shutil.rmtree(self.staging, ignore_errors=True)  # a killed build's leftovers
        self.staging.mkdir(parents=True)
        self.ids, self.masks, self.names = [], [], []

    def add(self, ids, mask) -> None:
        self.ids.append(ids)
        self.masks.append(mask)
        if len(self.ids) >= self.rows:
            self._flush()

    def _flush(self) -> None:
        if not self.ids:
            return
        name = f"part-{len(self.names):05d}.parquet"
        tmp = self.staging / (name + ".tmp")
        pq.write_table(pa.table([pa.array(self.ids, SCHEMA.field(INPUT_IDS).type),
                                 pa.array(self.masks, SCHEMA.field(LOSS_MASK).type)], schema=SCHEMA), tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.staging / name)
        self.names.append(name)
        self.ids, self.masks = [], []

    def commit(self) -> list[str]:
        self._flush()
        for name in self.names:
            os.replace(self.staging / name, self.out / name)
        self.staging.rmdir()
        _fsync_dir(self.out)
        return self.names

    def abort(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


def rows_of(conv: Conversation, template: ChatTemplate, per_turn: bool):
    """(input_ids, loss_mask) per row of one conversation; Drop when it gives none."""
    if conv.prompt_ids is not None:
        yield template.regenerated_row(conv.messages, conv.prompt_ids, conv.completion_ids, f"record {conv.id}")
        return
    turns = conv.assistant_turns()
    if not turns:
        raise Drop(NO_ASSISTANT)
    if per_turn:
        for i in turns:
            yield template.row(conv.messages[:i + 1], [i])
    else:  # messages after the last assistant turn supervise nothing
        yield template.row(conv.messages[:turns[-1] + 1], turns)


def refuse_existing(out: Path) -> None:
    """--out must be a directory to be (a file is not; nor a directory under a file) and hold no
    Parquet yet. dflash-data checks it before anything else (regenerate: before the server is asked)."""
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--out {out}: {probe} is a file, not a directory", "give --out a directory path")
    if not os.access(probe, os.W_OK):
        raise ConfigError(f"--out {out}: {probe} is not writable", "choose a writable --out or fix its ownership")
    old = sorted(out.glob("*.parquet")) if out.is_dir() else []
    if old:
        built = " (build.json: an earlier dflash-data build)" if (out / SUMMARY).exists() else ""
        raise ConfigError(f"--out {out} already holds {len(old)} Parquet file(s){built}",
                          "remove them or choose another --out: new shards would be trained on together with them")


def build(conversations, template: ChatTemplate, out, opts: BuildOptions, log=print) -> dict:
    """Write the data set; returns the summary (also OUT/build.json). ConfigError before anything
    is written when the input cannot make training data."""
    out = Path(out)
    refuse_existing(out)
    made = out  # the topmost directory this build creates: a refused build removes it again
    while not made.parent.exists():
        made = made.parent
    made = None if out.exists() else made
    out.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(out, opts.shard_rows)
    dropped, seen, lengths, supervised = Counter(), set(), [], 0
    convs = truncated = 0
    try:
        for conv in conversations:
            convs += 1
            try:
                rows = list(rows_of(conv, template, opts.per_turn))
            except Drop as d:
                dropped[str(d)] += 1
                continue
            for ids, mask in rows:
                if len(ids) > opts.max_len:
                    ids, mask = ids[:opts.max_len], mask[:opts.max_len]
                    truncated += 1
                if not any(mask):
                    dropped[NOTHING_SUPERVISED] += 1
                    continue
                if opts.dedup:
                    key = hashlib.blake2b(np.asarray(ids, np.int64).tobytes() + bytes(mask), digest_size=16).digest()
                    if key in seen:
                        dropped[DUPLICATE] += 1
                        continue
                    seen.add(key)
                writer.add(ids, mask)
                lengths.append(len(ids))
                supervised += sum(mask)
        if not lengths:
            _refuse_empty(convs, dropped)
        names = writer.commit()
    except BaseException:
        writer.abort()
        d = out
        while made is not None:  # empty now: what this build created, bottom up
            d.rmdir()
            if d == made:
                break
            d = d.parent
        raise
    lens = np.asarray(lengths)
    summary = {"rows": len(lens), "conversations": convs, "shards": names, "tokens": int(lens.sum()),
               "supervised_tokens": int(supervised), "supervised_fraction": round(supervised / lens.sum(), 4),
               "length": {f"p{q}": int(np.percentile(lens, q)) for q in (50, 90, 99)} | {"max": int(lens.max())},
               "truncated": truncated, "dropped": dict(dropped.most_common()),
               "options": asdict(opts), "model": str(template.model_dir), "thinking": template.thinking}
    tmp = out / (SUMMARY + ".tmp")
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    os.replace(tmp, out / SUMMARY)
    for line in summary_lines(summary, out):
        log(line)
    return summary


def _refuse_empty(convs: int, dropped: Counter) -> None:
    if convs == 0:
        raise ConfigError("the input holds no conversation", "give JSONL or Parquet files of conversations")
    if dropped[NO_ASSISTANT] == convs:
        raise ConfigError(f"none of the {convs} conversation(s) has an assistant turn (prompts only?)",
                          "answer them with the target: dflash-data regenerate --server URL ...")
    if dropped[NOTHING_SUPERVISED] and dropped[NOTHING_SUPERVISED] == dropped.total() - dropped[DUPLICATE]:
        raise ConfigError(f"the loss mask supervises nothing in any of the {convs} conversation(s) within "
                          "--max-len (the prompts fill it)", "raise --max-len, or shorten the prompts")
    reasons = "; ".join(f"{n} {r}" for r, n in dropped.most_common())
    raise ConfigError(f"no row left of {convs} conversation(s): {reasons}",
                      "check the conversations' roles and the target's chat template")


def summary_lines(s: dict, out) -> list[str]:
    lines = [f"build: {s['rows']:,} rows from {s['conversations']:,} conversation(s) in {len(s['shards'])} shard(s) "
             f"in {out}",
             f"build: {s['tokens']:,} tokens, {s['supervised_tokens']:,} supervised ({100 * s['supervised_fraction']:.1f}%); "
             f"length p50 {s['length']['p50']:,}, p90 {s['length']['p90']:,}, p99 {s['length']['p99']:,}, "
             f"max {s['length']['max']:,}"]
    if s["truncated"]:
        lines.append(f"build: {s['truncated']:,} row(s) truncated to --max-len {s['options']['max_len']:,}")
    dropped = s["dropped"]
    lines.append("build: dropped " + (", ".join(f"{n:,} ({r})" for r, n in dropped.items()) if dropped else "none"))
    return lines

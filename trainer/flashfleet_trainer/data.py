"""Training data: Parquet completions, deterministic shuffling, packing, anchors and block labels.

Format (`--data-dir`): one or more `*.parquet` files (read in name order; subdirectories are
ignored) with
    input_ids  list<integer>   token ids of prompt + completion
    loss_mask  list<integer|bool>, optional, same length; 1 = supervised (the completion).
               Absent = every token supervised.
Sequences are truncated to --max-seq-len. Token ids are kept as one flat int32 array plus
offsets, so a large data set costs 4-5 bytes per token of host memory.

Packing: per epoch a permutation from (seed, epoch), then greedy micro-batches of at most
--token-budget tokens and --max-batch-size sequences, in that order. The data position saved
in a checkpoint is (epoch, micro-batch index), which together with the seed fixes everything.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from .errors import ConfigError
from .loss import IGNORE

# The Parquet columns: owned here, written by data_build (dflash-data) and tiny data sets.
INPUT_IDS = "input_ids"
LOSS_MASK = "loss_mask"


def parquet_files(data_dir) -> list[Path]:
    d = Path(data_dir)
    if not d.is_dir():
        raise ConfigError(f"--data-dir {d} is not a directory", "point --data-dir at the staged Parquet data")
    files = sorted(d.glob("*.parquet"))
    if not files:
        raise ConfigError(f"--data-dir {d} holds no *.parquet files", "stage the tokenized completions there")
    return files


def _is_int_list(t: pa.DataType, allow_bool=False) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    v = t.value_type
    return pa.types.is_integer(v) or (allow_bool and pa.types.is_boolean(v))


def check_schema(data_dir) -> tuple[list[Path], int]:
    """Validate every file's schema (cheap: footers only). Returns (files, total rows)."""
    files, rows = parquet_files(data_dir), 0
    for f in files:
        try:
            meta = pq.read_metadata(f)
            schema = meta.schema.to_arrow_schema()
        except Exception as e:
            raise ConfigError(f"{f} is not readable Parquet ({e})", "re-export the data as Parquet") from e
        names = schema.names
        if INPUT_IDS not in names:
            raise ConfigError(f"{f}: no `input_ids` column (columns: {', '.join(names)})",
                              "write token ids as an `input_ids` list<int> column")
        if not _is_int_list(schema.field(INPUT_IDS).type):
            raise ConfigError(f"{f}: `input_ids` has type {schema.field(INPUT_IDS).type}, not list<integer>",
                              "store pre-tokenized ids, not text")
        if LOSS_MASK in names and not _is_int_list(schema.field(LOSS_MASK).type, allow_bool=True):
            raise ConfigError(f"{f}: `loss_mask` has type {schema.field(LOSS_MASK).type}, not list<integer|bool>",
                              "store loss_mask as a list of 0/1 per token")
        rows += meta.num_rows
    if rows == 0:
        raise ConfigError(f"--data-dir {data_dir}: the Parquet files hold no rows", "stage non-empty data")
    return files, rows


@dataclass
class TokenData:
    """All sequences as flat arrays: sequence i is tokens[offsets[i]:offsets[i+1]]."""

    tokens: np.ndarray  # int32 [total]
    mask: np.ndarray  # uint8 [total], 1 = supervised
    offsets: np.ndarray  # int64 [n+1]

    def __len__(self):
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def seq(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        s, e = self.offsets[i], self.offsets[i + 1]
        return self.tokens[s:e], self.mask[s:e]


def load_data(data_dir, max_seq_len: int, vocab_size: int | None = None) -> TokenData:
    files, _ = check_schema(data_dir)
    toks, masks, lens = [], [], []
    for f in files:
        table = pq.read_table(f, columns=[c for c in (INPUT_IDS, LOSS_MASK) if c in pq.read_schema(f).names])
        ids = table.column(INPUT_IDS).combine_chunks()
        has_mask = LOSS_MASK in table.column_names
        lm = table.column(LOSS_MASK).combine_chunks() if has_mask else None
        for r in range(len(ids)):
            x = np.asarray(ids[r].values.to_numpy(zero_copy_only=False), dtype=np.int64)
            if has_mask:
                if not lm[r].is_valid or len(lm[r]) != len(ids[r]):
                    raise ConfigError(f"{f} row {r}: loss_mask length differs from input_ids length",
                                      "write one loss_mask entry per token")
                m = np.asarray(lm[r].values.to_numpy(zero_copy_only=False), dtype=np.uint8)
            else:
                m = np.ones(len(x), dtype=np.uint8)
            x, m = x[:max_seq_len], m[:max_seq_len]
            if len(x) < 2:
                continue
            if vocab_size is not None and (x.min() < 0 or x.max() >= vocab_size):
                raise ConfigError(f"{f} row {r}: token id {int(x.max())} outside the target's vocab of {vocab_size}",
                                  "tokenize with the target model's tokenizer")
            toks.append(x.astype(np.int32))
            masks.append((m != 0).astype(np.uint8))
            lens.append(len(x))
    if not lens:
        raise ConfigError(f"--data-dir {data_dir}: no sequence has 2 or more tokens", "check the data export")
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lens)
    data = TokenData(np.concatenate(toks), np.concatenate(masks), offsets)
    if not supervised_pairs(data.mask, offsets):
        # Zero anchors everywhere: every step's loss would be 0/0 (nan) on zero rows, and the run
        # would "complete" having learnt nothing. preflight refuses it too, where it read the data.
        raise ConfigError(f"--max-seq-len {max_seq_len}: no supervised token pair is left in --data-dir {data_dir} "
                          "after truncation (a run would train on zero rows)",
                          "raise --max-seq-len above the prompts' length, or check loss_mask")
    return data


def supervised_pairs(mask: np.ndarray, offsets: np.ndarray) -> int:
    """Anchor candidates (anchor_candidates) of all sequences of flat `mask` split at `offsets`."""
    m = mask.astype(bool)
    ok = m[:-1] & m[1:]
    ok[offsets[1:-1] - 1] = False  # a pair across two sequences is none
    return int(ok.sum())


def pack_epoch(lengths, seed: int, epoch: int, token_budget: int, max_batch_size: int) -> list[list[int]]:
    """Micro-batches (lists of sequence indices) for one epoch: shuffled by (seed, epoch), greedy."""
    order = np.random.default_rng([seed, epoch]).permutation(len(lengths))
    batches, cur, used = [], [], 0
    for i in order.tolist():
        n = int(min(lengths[i], token_budget))
        if cur and (used + n > token_budget or len(cur) >= max_batch_size):
            batches.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    if cur:
        batches.append(cur)
    return batches


def anchor_candidates(mask: np.ndarray) -> np.ndarray:
    """Positions a with a supervised anchor token and a supervised next token (a+1 < len)."""
    m = mask.astype(bool)
    ok = m[:-1] & m[1:]
    return np.nonzero(ok)[0]


def spread_anchors(counts: list[int], max_anchors: int) -> list[int]:
    """Split max_anchors over sequences in proportion to their candidate counts (largest remainder),
    never more than a sequence has. All candidates are taken when they fit."""
    total = sum(counts)
    if total <= max_anchors:
        return list(counts)
    raw = [c * max_anchors / total for c in counts]
    take = [min(c, int(r)) for c, r in zip(counts, raw, strict=True)]
    left = max_anchors - sum(take)
    for i in sorted(range(len(counts)), key=lambda i: raw[i] - int(raw[i]), reverse=True):
        if left <= 0:
            break
        if take[i] < counts[i]:
            take[i] += 1
            left -= 1
    return take


def sample_anchors(masks: list[np.ndarray], max_anchors: int, gen: torch.Generator) -> list[np.ndarray]:
    """Sorted anchor positions per sequence, drawn without replacement, at most max_anchors in total."""
    cands = [anchor_candidates(m) for m in masks]
    take = spread_anchors([len(c) for c in cands], max_anchors)
    out = []
    for c, k in zip(cands, take, strict=True):
        if k == 0:
            out.append(np.zeros(0, dtype=np.int64))
            continue
        pick = torch.randperm(len(c), generator=gen)[:k].numpy()
        out.append(np.sort(c[pick]))
    return out


@dataclass
class Blocks:
    """N draft blocks of size B, flattened over the micro-batch's sequences."""

    seq: torch.Tensor  # [N] which sequence of the micro-batch
    anchor: torch.Tensor  # [N] anchor position in that sequence
    input_ids: torch.Tensor  # [N, B] anchor token, then mask_token_id
    labels: torch.Tensor  # [N, B] token at anchor+k, IGNORE at k=0 / unsupervised / past the end
    teacher_pos: torch.Tensor  # [N, B] position whose target logits predict label k: anchor+k-1
    # [N, B] the data's token at anchor+k-1 (the anchor at k = 0 and 1; the anchor again past the
    # sequence's end): DFlash 2's selector, teacher-forced, conditions position k on it
    predecessors: torch.Tensor | None = None


def build_blocks(seqs: list[np.ndarray], masks: list[np.ndarray], anchors: list[np.ndarray],
                 block_size: int, mask_token_id: int) -> Blocks:
    """Block k (k = 1..B-1) predicts the token AT anchor+k (same position, not next token).

    A label exists only where anchor+k is inside the sequence and supervised; position 0 (the
    anchor itself, given to the drafter) never has one.
    """
    seq_idx = np.concatenate([np.full(len(a), i) for i, a in enumerate(anchors)]).astype(np.int64)
    anc = np.concatenate(anchors).astype(np.int64)
    n, b = len(anc), block_size
    k = np.arange(b)
    labels = np.full((n, b), IGNORE, dtype=np.int64)
    ids = np.full((n, b), mask_token_id, dtype=np.int64)
    prev = np.empty((n, b), dtype=np.int64)
    for j in range(n):
        s, a = seq_idx[j], anc[j]
        x, m = seqs[s], masks[s]
        ids[j, 0] = x[a]
        before = np.minimum(a + np.maximum(k - 1, 0), len(x) - 1)
        prev[j] = np.where(a + k - 1 < len(x), x[before], x[a])
        pos = a + k[1:]
        inside = pos < len(x)
        p = pos[inside]
        lab = np.where(m[p].astype(bool), x[p], IGNORE)
        labels[j, 1:1 + len(p)] = lab
    teacher_pos = anc[:, None] + np.maximum(k - 1, 0)[None, :]
    t = torch.from_numpy
    return Blocks(t(seq_idx), t(anc), t(ids), t(labels), t(teacher_pos), t(prev))

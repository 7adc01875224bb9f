"""Make a data set with one long sequence among short ones, for the faults scenario's OOM run.

    python long_sequence_data.py SRC_DATA_DIR OUT_DIR LONG_LEN TOKEN_BUDGET MAX_BATCH SEED

Copies SRC's sequences and adds one sequence of LONG_LEN tokens (the short ones concatenated,
loss mask 1 everywhere). With TOKEN_BUDGET = LONG_LEN the long sequence is a micro-batch of its
own, whose anchors (and memory) are many times those of the short batches. Prints, as JSON, at
which micro-batch of epoch 0 it comes for SEED (the trainer's own packing), so the caller can
check the run is READY and training before the memory spike.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from flashfleet_trainer.data import pack_epoch


def main():
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    long_len, budget, max_batch, seed = (int(x) for x in sys.argv[3:7])
    table = pq.read_table(sorted(src.glob("*.parquet"))[0])
    ids = table.column("input_ids").to_pylist()
    masks = table.column("loss_mask").to_pylist()
    flat = [t for s in ids for t in s]
    ids.append(flat[:long_len])
    masks.append([1] * long_len)
    lengths = np.array([len(s) for s in ids])
    batches = pack_epoch(lengths, seed, 0, budget, max_batch)
    where = next(i for i, b in enumerate(batches) if len(ids) - 1 in list(b))
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())),
                             "loss_mask": pa.array(masks, pa.list_(pa.int8()))}), out / "train-00000.parquet")
    print(json.dumps({"seed": seed, "long_batch": where, "batches": len(batches), "sequences": len(ids)}))


if __name__ == "__main__":
    main()

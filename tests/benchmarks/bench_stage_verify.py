"""Re-run cost of the dataset role's verification: quick (size + mtime against the record of the
last hash) versus full (sha256 of every byte), on files made here.

    python -m tests.benchmarks.bench_stage_verify --files 16 --mib 64 --runs 5

Prints the median seconds of each mode over --runs re-runs of verify_only() on the same staged
directory (the page cache is warm after the first hash, so "full" is the best case for hashing).
"""

import argparse
import hashlib
import os
import statistics
import tempfile
import time

import flashfleet.stage as fs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        expected = {}
        for i in range(a.files):
            data = os.urandom(a.mib << 20)
            rel = f"part-{i:03d}.bin"
            with open(os.path.join(root, rel), "wb") as f:
                f.write(data)
            expected[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        missing, _mismatched, recorded = fs.verify_only(expected, root)  # the first, full verification
        assert not missing
        timings = {}
        for mode, trusted in (("full", None), ("quick", recorded)):
            runs = []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                missing, _, _ = fs.verify_only(expected, root, recorded=trusted)
                runs.append(time.perf_counter() - t0)
                assert not missing
            timings[mode] = statistics.median(runs)
        total = a.files * a.mib
        for mode, sec in timings.items():
            print(f"{mode:5s}: {a.files} files, {total} MiB: median {sec * 1000:.1f} ms over {a.runs} runs")


if __name__ == "__main__":
    main()

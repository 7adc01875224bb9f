#!/usr/bin/env python3
"""Test fixture for the staging scenario: seed the local S3 server (moto) and benchmark staging.

seed:  create an IAM user with S3 access, two buckets, a dataset, a small two-shard safetensors
       model and a larger one-shard model; write their sha256 and the user's keys to --out; then
       turn moto's IAM authentication on, so wrong keys are rejected like on a real endpoint.
bench: stage the same files one at a time and N at a time (fresh destination each time) and print the
       medians as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import struct
import sys
import time
import urllib.request

import boto3

ENDPOINT = "http://127.0.0.1:5000"
POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}


def wait_up():
    for _ in range(100):
        try:
            urllib.request.urlopen(ENDPOINT + "/moto-api/", timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("moto_server did not come up on " + ENDPOINT)


def safetensors(tensors):
    """{name: (dtype, shape)} -> bytes of a valid safetensors file with random data."""
    size = {"BF16": 2, "F32": 4}
    header, pos = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + n]}
        pos += n
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + os.urandom(pos), {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}


def objects():
    out = {}
    for i in range(12):
        out[f"ff-data/tok/part-{i:02d}.arrow"] = os.urandom(2 << 20)
    out["ff-data/tok/meta/info.json"] = json.dumps({"rows": 12, "format": "arrow"}).encode()
    s1, t1 = safetensors({"embed.weight": ("BF16", (256, 384)), "norm.weight": ("F32", (384,))})
    s2, t2 = safetensors({"layers.0.mlp.weight": ("BF16", (384, 256)), "lm_head.weight": ("BF16", (256, 384))})
    index = {
        "metadata": {"total_size": sum(t1.values()) + sum(t2.values())},
        "weight_map": {k: "model-00001-of-00002.safetensors" for k in t1}
        | {k: "model-00002-of-00002.safetensors" for k in t2},
    }
    out["ff-models/tiny/config.json"] = json.dumps({"model_type": "qwen3", "hidden_size": 384}).encode()
    out["ff-models/tiny/model-00001-of-00002.safetensors"] = s1
    out["ff-models/tiny/model-00002-of-00002.safetensors"] = s2
    out["ff-models/tiny/model.safetensors.index.json"] = json.dumps(index).encode()
    big, _ = safetensors({"w": ("BF16", (2048, 3072))})  # 12 MiB: more than the 8 MiB /dev/shm
    out["ff-models/big/model.safetensors"] = big
    out["ff-models/big/config.json"] = b"{}"
    return out


def moto_api(path, body=b""):
    req = urllib.request.Request(ENDPOINT + "/moto-api/" + path, data=body, method="POST")
    req.add_header("Content-Type", "text/plain")
    urllib.request.urlopen(req, timeout=30).read()


def seed(out_path):
    wait_up()
    moto_api("reset-auth", b"inf")  # a re-run starts from an empty, open server
    moto_api("reset")
    iam = boto3.client("iam", endpoint_url=ENDPOINT, region_name="us-east-1",
                       aws_access_key_id="seed", aws_secret_access_key="seed")  # fmt: skip
    iam.create_user(UserName="stager")
    iam.put_user_policy(UserName="stager", PolicyName="s3", PolicyDocument=json.dumps(POLICY))
    key = iam.create_access_key(UserName="stager")["AccessKey"]
    s3 = boto3.client("s3", endpoint_url=ENDPOINT, region_name="us-east-1",
                      aws_access_key_id="seed", aws_secret_access_key="seed")  # fmt: skip
    expected = {}
    for bucket in ("ff-data", "ff-models", "ff-bench"):
        s3.create_bucket(Bucket=bucket)
    for path, data in objects().items():
        bucket, key_name = path.split("/", 1)
        s3.put_object(Bucket=bucket, Key=key_name, Body=data)
        expected[path] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    # From here on every request must be signed with a key moto's IAM knows.
    moto_api("reset-auth", b"0")
    with open(out_path + ".tmp", "w") as f:
        json.dump({"objects": expected, "access_key": key["AccessKeyId"], "secret_key": key["SecretAccessKey"]}, f)
    os.replace(out_path + ".tmp", out_path)


def bench(creds_path, files, mib, levels, runs, package_dir):
    sys.path.insert(0, package_dir)  # the folder holding the project's `flashfleet` package
    import flashfleet.stage as fs
    creds = json.load(open(creds_path))
    kw = dict(endpoint_url=ENDPOINT, region="us-east-1", access_key=creds["access_key"],
              secret_key=creds["secret_key"], session_token=None, verify=True, host="bench")  # fmt: skip
    s3 = boto3.client("s3", endpoint_url=ENDPOINT, region_name="us-east-1",
                      aws_access_key_id=creds["access_key"], aws_secret_access_key=creds["secret_key"])  # fmt: skip
    for i in range(files):
        s3.put_object(Bucket="ff-bench", Key=f"b/f{i:03d}.bin", Body=os.urandom(mib << 20))
    url = "s3://ff-bench/b"
    result = {"files": files, "mib_each": mib, "runs": runs}
    for c in levels:
        rates = []
        for _ in range(runs):
            dest = "/var/tmp/ff-bench-dest"
            shutil.rmtree(dest, ignore_errors=True)
            src = fs.S3Source(url, concurrency=c, **kw)
            expected, _ = fs.merge_expected(src.listing(), {}, {})
            res, secs = fs.stage(src, expected, dest, c, 2)
            moved = sum(n for _a, n, _s in res.values())
            assert moved == files * (mib << 20)
            rates.append(moved / secs)
        shutil.rmtree("/var/tmp/ff-bench-dest", ignore_errors=True)
        result[f"concurrency_{c}_MBps"] = [round(r / 1e6, 1) for r in rates]
        result[f"concurrency_{c}_median_MBps"] = round(statistics.median(rates) / 1e6, 1)
    print(json.dumps(result, indent=1))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seed")
    s.add_argument("--out", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--creds", default="/opt/ff-test-s3/expected.json")
    b.add_argument("--package-dir", default="/opt/ff-test-s3", help="where the flashfleet package was copied")
    b.add_argument("--files", type=int, default=16)
    b.add_argument("--mib", type=int, default=8)
    b.add_argument("--levels", default="1,8", help="concurrency levels, comma separated (1 = one at a time)")
    b.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if a.cmd == "seed":
        seed(a.out)
    else:
        bench(a.creds, a.files, a.mib, [int(x) for x in a.levels.split(',')], a.runs, a.package_dir)


if __name__ == "__main__":
    main()

"""flashfleet.stage (the flashfleet_stage module's logic): manifest, plan, placement, the
safetensors check it runs (the contract's), stage() end to end against an in-memory source that
honours Range requests (skip, resume, refetch, manifest), and execute()'s placement messages.
Bad input against real servers (a loopback HTTP server with scripted faults, moto's S3 server):
every failure names host, file, problem and fix, only transient errors are retried, and nothing is
created on refused input; the module as a process and in a real play answers JSON, never a traceback."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import flashfleet.stage as fs
import pytest
from flashfleet.contract import safetensors

from tests.conftest import ROOT, failure_messages, local_inventory, reported


class MemSource:
    """Serves bytes from a dict; records every request (name, offset) and the bytes sent."""

    def __init__(self, files, honour_range=True):
        self.files = files
        self.honour_range = honour_range
        self.requests = []
        self.sent = 0
        self.lock = threading.Lock()

    def open_range(self, rel, offset):
        served = offset if self.honour_range else 0
        data = self.files[rel][served:]
        with self.lock:
            self.requests.append((rel, offset))
            self.sent += len(data)
        return io.BytesIO(data), served, len(self.files[rel])


def expected_for(files, with_sha=True):
    return {
        rel: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest() if with_sha else None, "etag": None}
        for rel, b in files.items()
    }


@pytest.fixture
def files():
    return {f"shard-{i:02d}.bin": os.urandom(300_000 + i * 1000) for i in range(6)} | {"sub/dir/x.txt": b"hello\n"}


# ---------------------------------------------------------------- pure helpers


@pytest.mark.parametrize(
    "url, bucket, prefix",
    [
        ("s3://data-bucket/tok/v2", "data-bucket", "tok/v2/"),
        ("s3://data-bucket/tok/v2/", "data-bucket", "tok/v2/"),
        ("s3://data-bucket", "data-bucket", ""),
    ],
)
def test_parse_s3_url(url, bucket, prefix):
    assert fs.parse_s3_url(url) == (bucket, prefix)


@pytest.mark.parametrize("url", ["s3:/x/y", "https://b/p", "s3://UPPER/x", "s3://a/x"])
def test_parse_s3_url_rejects(url):
    with pytest.raises(ValueError):
        fs.parse_s3_url(url)


@pytest.mark.parametrize(
    "rel, ok",
    [("a", True), ("a/b.bin", True), ("../x", False), ("/etc/passwd", False), ("a//b", False), ("a/./b", False), ("", False)],
)
def test_safe_relpath(rel, ok):
    assert fs.safe_relpath(rel) is ok


@pytest.mark.parametrize(
    "size, final, part, want",
    [
        (100, None, None, ("fetch", 0)),
        (100, 100, None, ("verify", 0)),
        (100, 40, None, ("resume", 40)),  # truncated final file
        (100, 140, None, ("fetch", 0)),  # longer than the source: wrong
        (100, 0, None, ("fetch", 0)),
        (100, None, 60, ("resume", 60)),
        (100, None, 100, ("fetch", 0)),  # a full-size .part was never verified: fetch again
        (100, None, 0, ("fetch", 0)),
    ],
)
def test_plan_file(size, final, part, want):
    assert fs.plan_file(size, final, part) == want


def test_normalize_manifest_rejects_bad_entries():
    assert fs.normalize_manifest({"a": {"size": 3, "sha256": "A" * 64}}) == {"a": {"size": 3, "sha256": "a" * 64}}
    for bad in ({"../a": {"size": 1}}, {"a": {"sha256": "0" * 64}}, {"a": {"size": -1}}, {"a": {"size": 1, "sha256": "xyz"}}):
        with pytest.raises(ValueError):
            fs.normalize_manifest(bad)


def test_merge_expected_trusts_recorded_hash_only_for_same_object():
    listing = {"a": {"size": 3, "etag": "e1"}, "b": {"size": 4, "etag": "e2"}}
    recorded = {"a": {"size": 3, "sha256": "1" * 64, "etag": "e1"}, "b": {"size": 4, "sha256": "2" * 64, "etag": "OLD"}}
    exp, errs = fs.merge_expected(listing, {}, recorded)
    assert errs == []
    assert exp["a"]["sha256"] == "1" * 64
    assert exp["b"]["sha256"] is None  # replaced at the source since: do not trust the old hash


def test_merge_expected_given_manifest_must_agree_with_source():
    listing = {"a": {"size": 3, "etag": None}}
    given = {"a": {"size": 5, "sha256": None}, "missing": {"size": 1, "sha256": None}}
    _exp, errs = fs.merge_expected(listing, given, {})
    assert any("a: the source has 3 bytes, the manifest says 5" in e for e in errs)
    assert any("missing: in the manifest but not at the source" in e for e in errs)


def test_check_content_uses_single_part_etag_when_no_sha():
    data = b"abc"
    md5 = hashlib.md5(data).hexdigest()
    sha = hashlib.sha256(data).hexdigest()
    assert fs.check_content({"sha256": None, "etag": f'"{md5}"'}, sha, md5) is None
    assert "ETag" in fs.check_content({"sha256": None, "etag": "0" * 32}, sha, md5)
    assert fs.check_content({"sha256": None, "etag": "abc-3"}, sha, md5) is None  # multipart: unknown
    assert "sha256" in fs.check_content({"sha256": "0" * 64, "etag": None}, sha, md5)


@pytest.mark.parametrize(
    "total, present, free, ratio, floor, fits",
    [
        (10 * 2**30, 0, 100 * 2**30, 0.1, 0, True),
        (10 * 2**30, 0, 10 * 2**30, 0.1, 0, False),  # fits exactly but no margin left
        (10 * 2**30, 10 * 2**30, 1 * 2**30, 0.1, 0, True),  # already staged: needs nothing more
        (1 * 2**30, 0, 2 * 2**30, 0.1, 2 * 2**30, False),  # the byte floor wins over the ratio
    ],
)
def test_placement(total, present, free, ratio, floor, fits):
    assert fs.placement(total, present, free, ratio, floor)[0] is fits


# ---------------------------------------------------------------- safetensors


def write_safetensors(path, tensors, corrupt_len=None):
    """tensors: {name: (dtype, shape)}; zero data. Returns {name: nbytes}."""
    header, pos, sizes = {}, 0, {}
    for name, (dtype, shape) in tensors.items():
        n = safetensors.DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + n]}
        sizes[name] = n
        pos += n
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    blob = struct.pack("<Q", len(hb)) + hb + bytes(pos)
    if corrupt_len is not None:
        blob = blob[:corrupt_len]
    Path(path).write_bytes(blob)
    return sizes


def test_safetensors_sharded_model_ok(tmp_path):
    a = write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"w1": ("BF16", (4, 8)), "b1": ("F32", (8,))})
    b = write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"w2": ("BF16", (8, 4))})
    index = {
        "metadata": {"total_size": sum(a.values()) + sum(b.values())},
        "weight_map": {"w1": "model-00001-of-00002.safetensors", "b1": "model-00001-of-00002.safetensors",
                       "w2": "model-00002-of-00002.safetensors"},
    }  # fmt: skip
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert fs.safetensors.check_dir(tmp_path) == []


def test_safetensors_truncated_shard_and_bad_index(tmp_path):
    full = write_safetensors(tmp_path / "m.safetensors", {"w": ("F16", (16, 16))})
    size = (tmp_path / "m.safetensors").stat().st_size
    write_safetensors(tmp_path / "m.safetensors", {"w": ("F16", (16, 16))}, corrupt_len=size - 10)
    index = {"metadata": {"total_size": full["w"] + 2}, "weight_map": {"w": "m.safetensors", "v": "gone.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    errs = fs.safetensors.check_dir(tmp_path)
    assert any("m.safetensors" in e and "offsets" in e for e in errs), errs
    assert any("gone.safetensors" in e for e in errs), errs
    assert any("total_size" in e for e in errs), errs


def test_safetensors_garbage_header(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", 5) + b"{oops" + b"\0" * 4)
    errs = fs.safetensors.check_dir(tmp_path)
    assert errs and "not JSON" in errs[0]
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}")
    assert "does not fit" in fs.safetensors.check_dir(tmp_path)[0]


@pytest.mark.parametrize("entry, needle", [
    ({"dtype": "F16", "shape": ["four"], "data_offsets": [0, 2]}, "w: malformed entry"),
    ({"dtype": ["F16"], "shape": [1], "data_offsets": [0, 2]}, "w: unknown dtype"),
    ({"dtype": "F16", "shape": [1], "data_offsets": ["0", None]}, "w: malformed entry"),
])
def test_safetensors_header_of_wrong_types_is_a_problem_not_a_crash(tmp_path, entry, needle):
    header = json.dumps({"w": entry}).encode()
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
    errs = fs.safetensors.check_dir(tmp_path)
    assert any(needle in e for e in errs), errs


# ---------------------------------------------------------------- stage() end to end


def counts(results):
    out = {}
    for action, _n, _sha in results.values():
        out[action] = out.get(action, 0) + 1
    return out


def test_stage_then_second_run_moves_nothing(tmp_path, files):
    src = MemSource(files)
    res, _ = fs.stage(src, expected_for(files, with_sha=False), str(tmp_path), concurrency=4, attempts=2)
    assert counts(res) == {"downloaded": len(files)}
    assert src.sent == sum(map(len, files.values()))
    for rel, data in files.items():
        assert (tmp_path / rel).read_bytes() == data
        assert not (tmp_path / (rel + fs.PART_SUFFIX)).exists()
    manifest = {rel: {"size": len(b), "sha256": sha} for rel, (_a, _n, sha) in res.items() for b in [files[rel]]}
    assert fs.write_manifest(str(tmp_path), "mem://", manifest) is True
    assert fs.write_manifest(str(tmp_path), "mem://", manifest) is False  # unchanged: no write
    recorded = fs.read_recorded(str(tmp_path))
    assert recorded["shard-00.bin"]["sha256"] == hashlib.sha256(files["shard-00.bin"]).hexdigest()

    src2 = MemSource(files)
    exp, _ = fs.merge_expected({r: {"size": len(b), "etag": None} for r, b in files.items()}, {}, recorded)
    res2, _ = fs.stage(src2, exp, str(tmp_path), concurrency=4, attempts=2)
    assert counts(res2) == {"skipped": len(files)}
    assert src2.requests == [] and src2.sent == 0


def test_corrupted_file_is_fetched_again(tmp_path, files):
    exp = expected_for(files)
    fs.stage(MemSource(files), exp, str(tmp_path), 4, 2)
    p = tmp_path / "shard-03.bin"
    blob = bytearray(p.read_bytes())
    blob[1234] ^= 0xFF  # same size, one flipped byte
    p.write_bytes(bytes(blob))
    src = MemSource(files)
    with pytest.raises(fs.StageError, match="shard-03.bin.*differ from the manifest.*repair: true"):
        fs.stage(src, exp, str(tmp_path), 4, 2)  # without repair: named, left alone, nothing fetched
    assert src.requests == [] and p.read_bytes() != files["shard-03.bin"]
    res, _ = fs.stage(src, exp, str(tmp_path), 4, 2, repair=True)
    assert res["shard-03.bin"][0] == "refetched"
    assert counts(res) == {"skipped": len(files) - 1, "refetched": 1}
    assert p.read_bytes() == files["shard-03.bin"]
    assert src.requests == [("shard-03.bin", 0)]


def test_truncated_and_partial_files_are_resumed_with_range(tmp_path, files):
    exp = expected_for(files)
    (tmp_path / "shard-01.bin").write_bytes(files["shard-01.bin"][:100_000])  # truncated final file
    (tmp_path / ("shard-02.bin" + fs.PART_SUFFIX)).write_bytes(files["shard-02.bin"][:250_000])  # interrupted
    src = MemSource(files)
    res, _ = fs.stage(src, exp, str(tmp_path), 3, 2)
    assert res["shard-01.bin"][:2] == ("resumed", len(files["shard-01.bin"]) - 100_000)
    assert res["shard-02.bin"][:2] == ("resumed", len(files["shard-02.bin"]) - 250_000)
    assert ("shard-01.bin", 100_000) in src.requests and ("shard-02.bin", 250_000) in src.requests
    for rel, data in files.items():
        assert (tmp_path / rel).read_bytes() == data


def test_resume_on_a_bad_prefix_falls_back_to_a_full_fetch(tmp_path, files):
    exp = expected_for(files)
    (tmp_path / "shard-04.bin").write_bytes(b"\0" * 50_000)  # wrong bytes, shorter than the object
    res, _ = fs.stage(MemSource(files), exp, str(tmp_path), 2, 3)
    assert res["shard-04.bin"][0] == "refetched"
    assert (tmp_path / "shard-04.bin").read_bytes() == files["shard-04.bin"]


def test_server_ignoring_range_restarts_cleanly(tmp_path, files):
    exp = expected_for(files)
    (tmp_path / ("shard-05.bin" + fs.PART_SUFFIX)).write_bytes(files["shard-05.bin"][:1000])
    fs.stage(MemSource(files, honour_range=False), exp, str(tmp_path), 2, 2)
    assert (tmp_path / "shard-05.bin").read_bytes() == files["shard-05.bin"]


def test_checksum_mismatch_is_not_retried_and_leaves_no_part(tmp_path):
    """A hash mismatch is deterministic: one request, then a failure naming host, file and fix;
    the .part is removed (the bytes are still at the source)."""
    files = {"a.bin": b"x" * 1000}
    exp = {"a.bin": {"size": 1000, "sha256": "0" * 64, "etag": None}}
    src = MemSource(files)
    with pytest.raises(fs.StageError, match=r"^gpu01: a.bin: the downloaded bytes do not match .*not retried.*Fix: ") as err:
        fs.stage(src, exp, str(tmp_path), 1, 3, host="gpu01")
    assert src.requests == [("a.bin", 0)]
    assert err.value.result["host"] == "gpu01" and err.value.result["file"] == "a.bin" and err.value.result["fix"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _recorded_after(res, files, root):
    """The manifest run_module writes after staging: size, sha256 and the mtime it was hashed at."""
    return {rel: {"size": len(files[rel]), "sha256": sha, "mtime_ns": fs.mtime_ns(str(root / rel))}
            for rel, (_a, _n, sha) in res.items()}


def test_quick_verify_hashes_only_files_touched_since_their_last_verification(tmp_path, files, monkeypatch):
    exp = expected_for(files)
    recorded = _recorded_after(fs.stage(MemSource(files), exp, str(tmp_path), 4, 2)[0], files, tmp_path)
    hashed = []
    real_digests = fs.files.digests
    monkeypatch.setattr(fs.files, "digests", lambda path, algorithms=("sha256",), limit=None: (
        hashed.append(os.path.basename(path)), real_digests(path, algorithms, limit))[1])
    res, _ = fs.stage(MemSource(files), exp, str(tmp_path), 4, 2, recorded=recorded)
    assert counts(res) == {"skipped": len(files)} and hashed == []

    # Rewritten in place (new mtime, same size): quick verify notices and fetches it again.
    p = tmp_path / "shard-02.bin"
    p.write_bytes(b"\0" * len(files["shard-02.bin"]))
    os.utime(p, ns=(recorded["shard-02.bin"]["mtime_ns"] + 10**9,) * 2)
    res, _ = fs.stage(MemSource(files), exp, str(tmp_path), 4, 2, recorded=recorded, repair=True)
    assert res["shard-02.bin"][0] == "refetched" and hashed == ["shard-02.bin"]
    assert p.read_bytes() == files["shard-02.bin"]


def test_full_verify_catches_what_quick_verify_cannot(tmp_path, files):
    """A flipped byte with the mtime put back (silent corruption) passes quick verify by design;
    verify=full re-hashes and fetches it again."""
    exp = expected_for(files)
    recorded = _recorded_after(fs.stage(MemSource(files), exp, str(tmp_path), 4, 2)[0], files, tmp_path)
    p = tmp_path / "shard-03.bin"
    blob = bytearray(p.read_bytes())
    blob[7] ^= 0xFF
    p.write_bytes(bytes(blob))
    os.utime(p, ns=(recorded["shard-03.bin"]["mtime_ns"],) * 2)
    quick, _ = fs.stage(MemSource(files), exp, str(tmp_path), 4, 2, recorded=recorded)
    assert quick["shard-03.bin"][0] == "skipped"
    full, _ = fs.stage(MemSource(files), exp, str(tmp_path), 4, 2, repair=True)
    assert full["shard-03.bin"][0] == "refetched" and p.read_bytes() == files["shard-03.bin"]


def test_quick_verify_never_trusts_a_record_of_other_content(tmp_path):
    data = b"payload"
    (tmp_path / "f").write_bytes(data)
    rec = {"f": {"size": len(data), "sha256": "a" * 64, "mtime_ns": fs.mtime_ns(str(tmp_path / "f"))}}
    assert fs.still_verified(str(tmp_path / "f"), rec["f"], "a" * 64)
    assert not fs.still_verified(str(tmp_path / "f"), rec["f"], "b" * 64)  # the manifest wants other bytes
    assert not fs.still_verified(str(tmp_path / "f"), rec["f"], None)  # the source changed (no hash known)
    assert not fs.still_verified(str(tmp_path / "f"), {**rec["f"], "mtime_ns": None}, "a" * 64)  # old record
    missing, _bad, manifest = fs.verify_only({"f": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}},
                                             str(tmp_path), recorded=rec)
    assert missing == [] and manifest["f"]["sha256"] == hashlib.sha256(data).hexdigest()  # hashed, not trusted


def test_verify_only_lists_missing_and_mismatched_and_deletes_nothing(tmp_path):
    good, bad = b"good data", b"bad data!"
    (tmp_path / "good").write_bytes(good)
    (tmp_path / "bad").write_bytes(bad)
    (tmp_path / "long").write_bytes(b"12345")
    exp = {
        "good": {"size": len(good), "sha256": hashlib.sha256(good).hexdigest()},
        "bad": {"size": len(bad), "sha256": hashlib.sha256(b"other!!!!").hexdigest()},
        "long": {"size": 2, "sha256": None},
        "absent": {"size": 1, "sha256": None},
    }
    missing, mismatched, manifest = fs.verify_only(exp, str(tmp_path))
    assert missing == ["absent"] and [rel for rel, _ in mismatched] == ["bad", "long"]
    assert list(manifest) == ["good"] and (tmp_path / "bad").read_bytes() == bad


def test_local_manifest_skips_state_files(tmp_path):
    (tmp_path / "a").write_bytes(b"1")
    (tmp_path / fs.MANIFEST_NAME).write_text("{}")
    (tmp_path / ("b" + fs.PART_SUFFIX)).write_bytes(b"2")
    assert list(fs.local_manifest(str(tmp_path))) == ["a"]


# ---------------------------------------------------------------- execute(): the module's options in, result out


def _params(**kw):
    """Every option of the flashfleet_stage module, at its argument-spec default."""
    base = dict(src=None, dest=None, fallback_dest=None, fallback_policy="warn", free_margin_ratio=0.1,
                free_margin_bytes=0, manifest=None, files=None, concurrency=8, endpoint_url=None,
                region="us-east-1", access_key=None, secret_key=None, session_token=None, verify_tls=True,
                retries=3, check_safetensors=False, host_label="gpu01", mode="stage", verify="quick",
                repair=False)
    return base | kw


def _too_big_for_dest(tmp_path, **kw):
    """A verify-only staging whose margin no file system can keep: it must go to fallback_dest."""
    data = b"model bytes"
    return _params(dest=str(tmp_path / "shm" / "m"), fallback_dest=str(tmp_path / "disk" / "m"),
                   manifest={"w.bin": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}},
                   free_margin_bytes=2**62, **kw)


def test_fallback_warning_names_the_fallback_directory(tmp_path):
    """The warning used to print the literal text {p['fallback_dest']} (a missing f-string)."""
    warnings = []
    p = _too_big_for_dest(tmp_path)
    result = fs.execute(p, warn=warnings.append)
    assert result["placement"] == "fallback" and result["dest"] == p["fallback_dest"]
    assert result["missing"] == ["w.bin"]  # verify-only: the caller copies it (rsync)
    (warning,) = warnings
    assert f"gpu01: 11 B does not fit in {p['dest']} with the margin" in warning
    assert f"staged to {p['fallback_dest']} on disk instead" in warning
    assert "{" not in warning and "dataset_model_shm_required: true" in warning


def test_fallback_policy_fail_is_an_error_naming_both_places(tmp_path):
    p = _too_big_for_dest(tmp_path, fallback_policy="fail")
    with pytest.raises(fs.StageError) as err:
        fs.execute(p, warn=pytest.fail)
    msg = str(err.value)
    assert f"does not fit in {p['dest']}" in msg and p["fallback_dest"] in msg
    assert "dataset_model_shm_required is true" in msg and "{" not in msg
    assert not (tmp_path / "disk").exists() and not (tmp_path / "shm").exists()


def test_room_enough_stays_in_the_preferred_place_and_verifies(tmp_path):
    data = b"model bytes"
    dest = tmp_path / "shm" / "m"
    dest.mkdir(parents=True)
    (dest / "w.bin").write_bytes(data)
    p = _params(dest=str(dest), fallback_dest=str(tmp_path / "disk" / "m"),
                manifest={"w.bin": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}})
    result = fs.execute(p, warn=pytest.fail)
    assert result["placement"] == "preferred" and result["missing"] == [] and result["changed"]
    assert fs.read_recorded(str(dest))["w.bin"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert fs.execute(p, warn=pytest.fail)["changed"] is False  # the manifest is already written


def test_a_staged_model_with_a_broken_shard_fails_naming_it(tmp_path):
    dest = tmp_path / "m"
    dest.mkdir()
    write_safetensors(dest / "model.safetensors", {"w": ("F16", (4, 4))})
    blob = (dest / "model.safetensors").read_bytes()[:-2]  # truncated
    (dest / "model.safetensors").write_bytes(blob)
    p = _params(dest=str(dest), check_safetensors=True,
                manifest={"model.safetensors": {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}})
    with pytest.raises(fs.StageError, match=r"m: safetensors check failed: model.safetensors: .*Fix:") as err:
        fs.execute(p)
    assert err.value.result["dest"] == str(dest) and err.value.result["host"] == "gpu01"


@pytest.mark.parametrize("p, needle", [
    ({"mode": "manifest", "src": "/nonexistent"}, "mode=manifest needs src to be a local directory"),
    ({"dest": None}, "dest is required"),
    ({"dest": "/x", "concurrency": 0}, "concurrency 0 is outside 1-256"),
    ({"dest": "/x", "manifest": {"../a": {"size": 1}}}, "bad manifest"),
    ({"dest": "/x"}, "verify-only staging (no src) needs a manifest"),
    ({"dest": "/x", "src": "ftp://a/b"}, "ftp://a/b: unsupported source"),
    ({"dest": "/x", "src": "https://h/base/"}, "an https source needs a manifest or a files list"),
])
def test_bad_options_fail_with_a_message(p, needle):
    with pytest.raises(fs.StageError, match=re.escape(needle)):
        fs.execute(_params(**p))


# ---------------------------------------------------------------- bad input, against real servers
# A loopback HTTP server (Range, HEAD, scripted faults) and moto's S3 server (the real protocol).



class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _serve(self, body):
        srv = self.server
        began = time.monotonic()
        rel = urllib.parse.unquote(self.path.lstrip("/"))
        rng = self.headers.get("Range")
        with srv.lock:
            srv.log.append((self.command, rel, rng))
            fault = srv.faults.pop(0) if body and srv.faults else None
        if body is False and srv.no_head:
            self.send_error(405)
            return
        if fault == "503":
            self.send_error(503)
            return
        if rel not in srv.files:
            self.send_error(404)
            return
        data = srv.files[rel]
        start = int(rng.split("=")[1].rstrip("-")) if rng else 0
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if body:
            payload = data[start:]
            if fault == "cut":  # half the bytes, then the connection drops
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if srv.gates:  # a link paced by the test: gate(began) returns when the body may go on
                sent = 0
                for upto, gate in srv.gates:
                    self.wfile.write(payload[sent:upto])
                    self.wfile.flush()
                    sent = max(sent, upto)
                    gate(began)
                self.wfile.write(payload[sent:])
                return
            if srv.rate:  # a slow link: rate bytes per second, in tenths of a second
                step = max(1, srv.rate // 10)
                for i in range(0, len(payload), step):
                    self.wfile.write(payload[i:i + step])
                    self.wfile.flush()
                    time.sleep(0.1)
                return
            self.wfile.write(payload)


@pytest.fixture
def http_source():
    """(base URL, server): server.files to serve, server.faults (per GET: '503', 'cut'),
    server.no_head, server.rate (bytes per second of a GET's body; 0: as fast as it goes),
    server.gates ([(offset, gate)]: a GET's body stops before each offset until gate(the monotonic
    time the request came in) returns), server.log of (method, name, Range)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.files, srv.faults, srv.log, srv.no_head, srv.lock = {}, [], [], False, threading.Lock()
    srv.rate, srv.gates = 0, []
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/base/", srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch):
    monkeypatch.setattr(fs, "RETRY_BACKOFF_S", 0.0)


def _manifest(files, **override):
    m = {rel: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for rel, b in files.items()}
    return m | override


def _gets(srv):
    return [(rel, rng) for method, rel, rng in srv.log if method == "GET"]


def _assert_fix_line(err, host="gpu01"):
    r = err.result
    assert r["host"] == host and r["file"] and r["problem"] and r["fix"], r
    assert str(err).startswith(f"{host}: ") and ". Fix: " in str(err) and "\n" not in str(err)


def test_http_source_stages_and_verifies(tmp_path, http_source):
    base, srv = http_source
    srv.files = {"base/a.bin": os.urandom(3000), "base/d/b.bin": b"b" * 10}
    files = {"a.bin": srv.files["base/a.bin"], "d/b.bin": srv.files["base/d/b.bin"]}
    dest = tmp_path / "data" / "x"
    result = fs.execute(_params(src=base, dest=str(dest), manifest=_manifest(files)))
    assert result["counts"]["downloaded"] == 2 and (dest / "d/b.bin").read_bytes() == b"b" * 10
    assert fs.execute(_params(src=base, dest=str(dest), manifest=_manifest(files)))["changed"] is False


def test_http_404_fails_naming_the_file_and_creates_nothing(tmp_path, http_source):
    base, srv = http_source
    srv.files = {"base/a.bin": b"abc"}
    dest = tmp_path / "data" / "x"
    with pytest.raises(fs.StageError) as err:
        fs.execute(_params(src=base, dest=str(dest), files=["a.bin", "gone.bin"]))
    _assert_fix_line(err.value)
    assert err.value.file == "gone.bin" and "HTTP 404" in err.value.problem
    assert not (tmp_path / "data").exists() and _gets(srv) == []


def test_size_from_the_manifest_is_compared_before_downloading(tmp_path, http_source):
    base, srv = http_source
    srv.files = {"base/a.bin": b"x" * 100}
    dest = tmp_path / "data" / "x"
    with pytest.raises(fs.StageError, match=r"a.bin: source .* disagrees .*source has 100 bytes, the manifest says 90") as err:
        fs.execute(_params(src=base, dest=str(dest), manifest={"a.bin": {"size": 90}}))
    _assert_fix_line(err.value)
    assert _gets(srv) == [] and not (tmp_path / "data").exists()


def test_size_of_the_get_is_checked_before_a_byte_is_written(tmp_path, http_source):
    """No HEAD at the server: the GET's own length is compared before anything is written."""
    base, srv = http_source
    srv.files, srv.no_head = {"base/a.bin": b"x" * 100}, True
    dest = tmp_path / "x"
    with pytest.raises(fs.StageError, match=r"a.bin: the source has 100 bytes, the manifest says 90; nothing was"):
        fs.execute(_params(src=base, dest=str(dest), manifest={"a.bin": {"size": 90}}))
    assert len(_gets(srv)) == 1 and not dest.exists()


def test_transient_errors_are_retried_and_a_broken_transfer_resumes(tmp_path, http_source):
    base, srv = http_source
    data = os.urandom(200_000)
    srv.files, srv.faults = {"base/a.bin": data}, ["503", "cut"]
    dest = tmp_path / "x"
    result = fs.execute(_params(src=base, dest=str(dest), manifest=_manifest({"a.bin": data}), retries=3))
    assert (dest / "a.bin").read_bytes() == data and result["counts"]["downloaded"] == 1
    gets = _gets(srv)
    assert len(gets) == 3 and gets[0][1] is None and gets[2][1] == f"bytes={len(data) // 2}-"  # resumed


def test_transient_errors_give_up_after_retries_keeping_the_part(tmp_path, http_source):
    base, srv = http_source
    data = os.urandom(100_000)
    srv.files, srv.faults = {"base/a.bin": data}, ["cut", "503"]
    with pytest.raises(fs.StageError, match=r"a.bin: 2 attempt\(s\) failed: .*HTTP 503.*Fix: .*resumed") as err:
        fs.execute(_params(src=base, dest=str(tmp_path / "x"), manifest=_manifest({"a.bin": data}), retries=2))
    _assert_fix_line(err.value)
    assert (tmp_path / "x" / ("a.bin" + fs.PART_SUFFIX)).stat().st_size == len(data) // 2  # resumable


def test_checksum_mismatch_from_a_real_server_is_not_retried(tmp_path, http_source):
    base, srv = http_source
    srv.files = {"base/a.bin": b"y" * 100}
    with pytest.raises(fs.StageError, match="do not match.*not retried") as err:
        fs.execute(_params(src=base, dest=str(tmp_path / "x"), retries=3,
                           manifest={"a.bin": {"size": 100, "sha256": "0" * 64}}))
    _assert_fix_line(err.value)
    assert len(_gets(srv)) == 1 and list((tmp_path / "x").iterdir()) == []


def test_unreachable_source_fails_after_retries_creating_nothing(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(fs.StageError, match=r"a.bin: 2 attempt\(s\) failed: cannot reach") as err:
        fs.execute(_params(src=f"http://127.0.0.1:{port}/", dest=str(tmp_path / "x"), files=["a.bin"], retries=2))
    _assert_fix_line(err.value)
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def s3_server():
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    url = f"http://127.0.0.1:{srv._server.server_address[1]}"
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    client.create_bucket(Bucket="ff-data")
    client.put_object(Bucket="ff-data", Key="tok/a.bin", Body=b"a" * 1000)
    client.put_object(Bucket="ff-data", Key="tok/b.bin", Body=b"b" * 10)
    yield url
    srv.stop()


def _s3(url, **kw):
    return _params(endpoint_url=url, access_key="test", secret_key="test", **kw)


def test_s3_stages_and_checks_the_etag(tmp_path, s3_server):
    dest = tmp_path / "tok"
    result = fs.execute(_s3(s3_server, src="s3://ff-data/tok", dest=str(dest)))
    assert result["counts"]["downloaded"] == 2 and (dest / "a.bin").read_bytes() == b"a" * 1000


def test_s3_size_other_than_the_manifest_is_refused_before_writing(tmp_path, s3_server):
    dest = tmp_path / "tok"
    with pytest.raises(fs.StageError, match="a.bin: source s3://ff-data/tok disagrees with the manifest: "
                                            "a.bin: the source has 1000 bytes, the manifest says 999") as err:
        fs.execute(_s3(s3_server, src="s3://ff-data/tok", dest=str(dest), manifest={"a.bin": {"size": 999}}))
    _assert_fix_line(err.value)
    assert not dest.exists()


def test_s3_missing_bucket_fails_and_creates_nothing(tmp_path, s3_server):
    dest = tmp_path / "tok"
    with pytest.raises(fs.StageError, match="bucket 'ff-nothing' does not exist") as err:
        fs.execute(_s3(s3_server, src="s3://ff-nothing/tok", dest=str(dest)))
    _assert_fix_line(err.value)
    assert not dest.exists()


# ---------------------------------------------------------------- the destination and the options


@pytest.mark.parametrize("bad, needle", [
    ({"retries": 0}, "retries 0 is below 1"),
    ({"concurrency": 300}, "concurrency 300 is outside 1-256"),
    ({"free_margin_ratio": 1.5}, "free_margin_ratio 1.5 is outside [0, 1)"),
    ({"free_margin_bytes": -1}, "free_margin_bytes -1 is negative"),
    ({"fallback_dest": "rel/dir"}, "fallback_dest 'rel/dir' is not an absolute path"),
    ({"manifest": {"a": {"size": "many"}}}, "bad manifest"),
    ({"manifest": {"a": "not a dict"}}, "bad manifest"),
    ({"src": "s3://Bad_Bucket/x"}, "not an s3://bucket/prefix URL"),
    ({"src": "ftp://h/x"}, "unsupported source"),
])
def test_bad_options_create_nothing(tmp_path, bad, needle):
    dest = tmp_path / "data" / "x"
    p = _params(dest=str(dest), manifest={"a": {"size": 1}}) | bad
    with pytest.raises(fs.StageError, match=re.escape(needle)) as err:
        fs.execute(p)
    _assert_fix_line(err.value)
    assert not (tmp_path / "data").exists()


def test_relative_dest_is_refused(tmp_path):
    with pytest.raises(fs.StageError, match="dest 'data/x' is not an absolute path"):
        fs.execute(_params(dest="data/x", manifest={"a": {"size": 1}}))


def test_dest_under_a_file_is_not_a_directory(tmp_path, http_source):
    base, srv = http_source
    srv.files = {"base/a.bin": b"abc"}
    (tmp_path / "blocker").write_text("a file")
    with pytest.raises(fs.StageError, match="is a file, not a directory") as err:
        fs.execute(_params(src=base, dest=str(tmp_path / "blocker" / "x"), files=["a.bin"]))
    _assert_fix_line(err.value)
    assert err.value.file == str(tmp_path / "blocker") and srv.log == []  # refused before the source is asked


def test_an_os_error_while_writing_is_named(tmp_path, http_source):
    """Something in the way of the partial file (here a directory) is named by path with a fix."""
    base, srv = http_source
    srv.files = {"base/a.bin": b"abc"}
    (tmp_path / "x" / ("a.bin" + fs.PART_SUFFIX)).mkdir(parents=True)
    with pytest.raises(fs.StageError, match=r"a.bin.flashfleet-part: Is a directory\. Fix: ") as err:
        fs.execute(_params(src=base, dest=str(tmp_path / "x"), files=["a.bin"]))
    _assert_fix_line(err.value)


def test_verify_only_mismatch_fails_unless_repair(tmp_path):
    dest = tmp_path / "m"
    dest.mkdir()
    (dest / "w.bin").write_bytes(b"changed!")
    manifest = {"w.bin": {"size": 8, "sha256": hashlib.sha256(b"original").hexdigest()}}
    with pytest.raises(fs.StageError, match=r"w.bin: 1 staged file\(s\) differ.*left as they are.*repair: true") as err:
        fs.execute(_params(dest=str(dest), manifest=manifest))
    _assert_fix_line(err.value)
    assert err.value.result["mismatched"] == ["w.bin"]
    assert (dest / "w.bin").read_bytes() == b"changed!" and sorted(os.listdir(dest)) == ["w.bin"]
    result = fs.execute(_params(dest=str(dest), manifest=manifest, repair=True))
    assert result["missing"] == ["w.bin"] and result["mismatched"] == ["w.bin"] and result["changed"] is False
    assert (dest / "w.bin").read_bytes() == b"changed!"  # the caller's copy replaces it; nothing deleted here


# The module as a process, as Ansible runs it: its answer is JSON, never a traceback.
MODULE_RUNNER = r"""
import json, sys
import flashfleet.stage as fs

class Module:
    check_mode = False
    def __init__(self, params): self.params = params
    def warn(self, msg): pass
    def fail_json(self, **kw): print(json.dumps({"failed": True, **kw})); sys.exit(1)
    def exit_json(self, **kw): print(json.dumps(kw)); sys.exit(0)

fs.run_module(Module(json.loads(sys.argv[1])))
"""


def _run_module_process(params, prefix=(), preexec=None, python=sys.executable, path=ROOT / "module_utils"):
    env = {**os.environ, "PYTHONPATH": str(path)}
    r = subprocess.run([*prefix, python, "-c", MODULE_RUNNER, json.dumps(params)], capture_output=True,
                       text=True, env=env, preexec_fn=preexec, timeout=60)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def test_read_only_destination_is_a_json_failure(tmp_path):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "--mount", "--map-root-user", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no mount namespace here to make a read-only file system")
    manifest = {"a": {"size": 1}}
    params = _params(dest=str(mnt / "data" / "x"), manifest=manifest)
    rc, out = _run_module_process(params, prefix=(
        "unshare", "--mount", "--map-root-user", "sh", "-c", f"mount -t tmpfs -o ro none {mnt} && exec \"$@\"", "sh"))
    assert rc == 1 and out["failed"]
    assert out["file"] == str(mnt) and out["problem"] == "is on a read-only file system" and out["host"] == "gpu01"
    assert "writable file system" in out["fix"]


def test_permission_denied_destination_is_a_json_failure(tmp_path):
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="ff-stage-perm-"))  # traversable by another user, unlike tmp_path
    try:
        top.chmod(0o755)
        locked = top / "locked"
        locked.mkdir(mode=0o555)
        locked.chmod(0o555)
        preexec, python, path = None, sys.executable, ROOT / "module_utils"
        if os.geteuid() == 0:  # root writes anywhere: the module runs as nobody, as without become
            def preexec():
                os.setgid(65534)
                os.setuid(65534)
            python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
            if not python:
                pytest.skip("no system python3 that another user may run")
            shutil.copytree(ROOT / "module_utils" / "flashfleet", top / "mu" / "flashfleet")
            path = top / "mu"
        params = _params(dest=str(locked / "x"), manifest={"a": {"size": 1}})
        rc, out = _run_module_process(params, preexec=preexec, python=python, path=path)
        assert rc == 1 and out["file"] == str(locked) and "permission denied" in out["problem"]
        assert "become: true" in out["fix"] and not (locked / "x").exists()
    finally:
        (top / "locked").chmod(0o755)
        shutil.rmtree(top)


def test_module_in_a_real_play_answers_json_for_every_bad_input(tmp_path, run_playbook, http_source):
    """flashfleet_stage as Ansible runs it (the package shipped with it): each bad input is a failed
    task with host, file, problem and fix, no module traceback, and nothing created."""
    base, srv = http_source
    srv.files = {"base/a.bin": b"abc"}
    (tmp_path / "blocker").write_text("a file")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "w.bin").write_bytes(b"changed!")
    cases = {
        "not-a-directory": {"src": base, "dest": str(tmp_path / "blocker" / "x"), "files": ["a.bin"]},
        "404": {"src": base, "dest": str(tmp_path / "d404"), "files": ["gone.bin"]},
        "size": {"src": base, "dest": str(tmp_path / "dsize"), "manifest": {"a.bin": {"size": 4}}},
        "retries": {"src": base, "dest": str(tmp_path / "dret"), "files": ["a.bin"], "retries": 0},
        "verify-only": {"dest": str(tmp_path / "m"), "manifest": {"w.bin": {"size": 8, "sha256": "0" * 64}}},
    }
    play = [{"hosts": "all", "gather_facts": False, "tasks": [
        {"name": name, "flashfleet_stage": {**args, "host_label": "gpu01"}, "ignore_errors": True}
        for name, args in cases.items()]}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"here": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    r = run_playbook(tmp_path / "play.yml", inventory,
                     envvars={"ANSIBLE_LIBRARY": str(ROOT / "roles/dataset/library")})
    failed = {ev["event_data"]["task"]: ev["event_data"]["res"] for ev in r.events
              if ev.get("event") == "runner_on_failed"}
    assert sorted(failed) == sorted(cases), failure_messages(r)
    for name, res in failed.items():
        assert "Traceback" not in json.dumps(res) and "module_stderr" not in res, (name, res)
        assert res["host"] == "gpu01" and res["file"] and res["problem"] and res["fix"], (name, res)
        assert res["msg"].startswith("gpu01: ") and "Fix: " in res["msg"], (name, res)
    assert "is a file, not a directory" in failed["not-a-directory"]["problem"]
    assert "HTTP 404" in failed["404"]["problem"] and "retries 0" in failed["retries"]["problem"]
    assert "3 bytes, the manifest says 4" in failed["size"]["problem"]
    assert failed["verify-only"]["mismatched"] == ["w.bin"] and (tmp_path / "m" / "w.bin").read_bytes() == b"changed!"
    for d in ("d404", "dsize", "dret"):
        assert not (tmp_path / d).exists()


# ---------------------------------------------------------------- progress of a long download


def test_progress_file_grows_while_a_slow_download_runs_and_says_done(tmp_path, http_source, monkeypatch):
    """The progress record (PROGRESS_KEYS) is rewritten during the transfer, bytes growing, and
    ends done with every byte; the module's result is the same as without it. The file is read
    back each time it is rewritten (not sampled on a timer, which a busy machine can starve past
    a rewrite); the server's pace (sleeps between tenths of a second's bytes) is only a lower bound
    on the transfer's time, so each file's arrival comes PROGRESS_EVERY_S or more after the last
    rewrite and is recorded."""
    monkeypatch.setattr(fs, "PROGRESS_EVERY_S", 0.2)
    base, srv = http_source
    srv.files = {"base/a.bin": os.urandom(600_000), "base/b.bin": os.urandom(200_000)}
    srv.rate = 400_000
    files = {"a.bin": srv.files["base/a.bin"], "b.bin": srv.files["base/b.bin"]}
    progress = tmp_path / "p" / "progress.json"
    seen = []
    real_write = fs.files.atomic_write_text

    def write_and_read_back(path, text, *args, **kwargs):
        out = real_write(path, text, *args, **kwargs)
        if Path(path) == progress:
            seen.append(json.loads(progress.read_text()))
        return out

    monkeypatch.setattr(fs.files, "atomic_write_text", write_and_read_back)
    result = fs.execute(_params(src=base, dest=str(tmp_path / "d"), manifest=_manifest(files),
                                progress_file=str(progress), concurrency=1))
    assert result["counts"]["downloaded"] == 2 and result["bytes_transferred"] == 800_000
    assert all(tuple(r) == fs.PROGRESS_KEYS for r in seen), seen
    moving = sorted({r["bytes_done"] for r in seen if not r["done"]})
    assert len(moving) >= 2 and moving[-1] > moving[0], seen
    assert {r["bytes_total"] for r in seen} == {800_000} and {r["files_total"] for r in seen} == {2}
    final = json.loads(progress.read_text())
    assert final["done"] and final["bytes_done"] == 800_000 and final["files_done"] == 2, final
    without = fs.execute(_params(src=base, dest=str(tmp_path / "d2"), manifest=_manifest(files)))
    assert {k: v for k, v in without.items() if k not in ("dest", "seconds", "throughput_bps")} == {
        k: v for k, v in result.items() if k not in ("dest", "seconds", "throughput_bps")}


def _role_play(tmp_path, base, **item):
    play = [{"hosts": "all", "gather_facts": False, "tasks": [{"ansible.builtin.include_role": {"name": "dataset"}}],
             "vars": {"dataset_data": [{"name": "tok", "src": base, **item}], "dataset_models": [],
                      "dataset_data_root": str(tmp_path / "data"), "dataset_check_boto3": False,
                      "dataset_progress_s": 1, "dataset_retries": 1}}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    return tmp_path / "play.yml"


def _staging_lines(runner) -> list[str]:
    return [ev["event_data"]["res"]["msg"] for ev in runner.events if ev.get("event") == "runner_on_ok"
            and ev["event_data"].get("task") == "Say how the staging goes"]


_STAGING_LINE = re.compile(
    r"staging, (\d+)m(\d+)s elapsed; ([\d.]+)/2\.9 MiB \((\d+)%\), \d/2 files(, shard-\d\.bin)?$")
_LISTING_LINE = re.compile(r"^data tok: staging, \d+m\d\ds elapsed; listing and checking the source$")


def _until(ready, timeout_s=300.0):
    """Wait until ready() is true; False after timeout_s (the server then goes on, and the test
    fails on what the play printed instead of hanging)."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_the_role_prints_progress_lines_during_a_slow_download(tmp_path, run_playbook, http_source):
    """The dataset role runs the module async and prints its progress file every
    dataset_progress_s seconds: growing bytes, a percentage, the file, the time elapsed; then the
    module's own result as before.

    The link goes at the play's pace, not the clock's: the server holds each file's body until the
    play has printed the progress record the module wrote before its requests (0 bytes) and
    PROGRESS_EVERY_S has passed since (the module rewrites the file at most that often, on a
    chunk's arrival); then it sends a first CHUNK of each file (the module reads and counts a
    chunk at a time), which the module records, and holds the rest until the play has printed
    those bytes at a later second. So the lines shown do not depend on how busy the machine is."""
    base, srv = http_source
    data = {"shard-0.bin": os.urandom(1_500_000), "shard-1.bin": os.urandom(1_500_000)}
    srv.files = {f"base/{k}": v for k, v in data.items()}
    pdd = run_playbook.private_data_dir

    def shown():  # (elapsed s, MiB done) of each progress line the play has printed so far
        return [(int(m.group(1)) * 60 + int(m.group(2)), float(m.group(3)))
                for m in map(_STAGING_LINE.search, reported(pdd, "Say how the staging goes")) if m]

    def first_record_shown(began):
        _until(lambda: shown() and time.monotonic() >= began + fs.PROGRESS_EVERY_S)

    def first_chunk_shown(_began):
        _until(lambda: (lines := shown()) and any(mib > 0 and t > lines[0][0] for t, mib in lines))

    srv.gates = [(0, first_record_shown), (fs.CHUNK, first_chunk_shown)]
    r = run_playbook(_role_play(tmp_path, base, manifest=_manifest(data)), local_inventory(tmp_path))
    assert r.rc == 0, "\n".join(failure_messages(r))
    lines = _staging_lines(r)
    listing = 0  # a look before the module has listed the source says so
    while listing < len(lines) and _LISTING_LINE.match(lines[listing]):
        listing += 1
    got = [_STAGING_LINE.search(x) for x in lines[listing:]]
    assert len(got) >= 2 and all(got), lines
    done = [float(m.group(3)) for m in got]
    assert done == sorted(done) and done[-1] > done[0], lines
    percent = [int(m.group(4)) for m in got]
    assert percent == sorted(percent) and any(0 < p < 100 for p in percent), lines
    elapsed = [int(m.group(1)) * 60 + int(m.group(2)) for m in got]
    assert elapsed == sorted(elapsed) and elapsed[-1] > elapsed[0], lines
    assert all(x.startswith("data tok: staging, ") for x in lines)
    assert "data tok: staging, 0m" in r.stdout.read()
    (report,) = [ev["event_data"]["res"]["msg"] for ev in r.events if ev.get("event") == "runner_on_ok"
                 and ev["event_data"].get("task", "").startswith("Report data tok")]
    assert "'downloaded': 2" in report and "3000000 bytes" in report, report
    assert (tmp_path / "data" / "tok" / "shard-1.bin").read_bytes() == data["shard-1.bin"]


def test_a_failing_staging_run_async_fails_with_the_modules_json(tmp_path, run_playbook, http_source):
    base, srv = http_source
    srv.files = {"base/a.bin": b"abc"}
    r = run_playbook(_role_play(tmp_path, base, manifest={"a.bin": {"size": 4}}), local_inventory(tmp_path))
    assert r.rc != 0
    (res,) = [ev["event_data"]["res"] for ev in r.events if ev.get("event") == "runner_on_failed"]
    assert res["host"] == "here" and res["file"] == "a.bin" and res["fix"], res
    assert "3 bytes, the manifest says 4" in res["problem"] and res["msg"].startswith("here: a.bin: "), res
    assert "Traceback" not in json.dumps(res) and not (tmp_path / "data").exists()

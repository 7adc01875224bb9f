#!/usr/bin/python
"""Stage a dataset or a model onto a host: parallel, verified, resumable, idempotent.

Why a module: the real launches downloaded a dataset from S3 by hand, in parallel by hand, and
copied a 27B model to /dev/shm by hand (incidents.md). Done by tasks, every file would be a round
trip from the controller; here the host fetches straight from the source with a thread pool, so
the data never passes through the controller and many files move at once.

Every file is checked against a manifest of sizes and sha256 (given by the caller, or written
beside the data after the first complete download). A file that is complete and verified is
skipped, so a second run transfers nothing and reports changed=false. Re-hashing terabytes on every
run is what makes people stop running the role, so by default (verify=quick) a file whose size and
mtime are still those recorded when it was last hashed keeps that verification, as rsync and
`aws s3 sync` decide; verify=full hashes every file again (silent corruption, a clock set back). A shorter file or a
``.part`` file is resumed with a Range request and then verified whole; a file whose hash does not
match is fetched again. S3 objects uploaded in one part carry their MD5 as ETag, which is checked
on the first download when no sha256 is known yet.

S3 access uses boto3 (any endpoint URL); the module must therefore run with an interpreter that
has boto3 (the trainer venv, whose lock pins it). https sources use only the standard library.
Credentials are module options marked no_log and never appear in results or messages.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import socket
import struct
import time
import urllib.error
import urllib.parse
import urllib.request

DOCUMENTATION = r"""
module: flashfleet_stage
short_description: Stage files from S3, https, or a local directory, verified against a manifest
description:
  - Lists the source (S3 ListObjectsV2 under a prefix; for https the manifest's or I(files)' names),
    then fetches every file that is missing, short, or corrupt, C(concurrency) files at a time.
  - Resumes partial files with Range requests; verifies size and sha256; writes the manifest
    (C(.flashfleet-manifest.json) in the destination) after the first complete download.
  - With I(fallback_dest), chooses I(dest) only when its file system has room for the files plus a
    margin, else I(fallback_dest) with a warning (or a failure with I(fallback_policy=fail)).
  - With I(src) omitted, only verifies I(dest) against I(manifest) (and places, see I(fallback_dest)):
    files that fail are deleted and listed in C(missing), for a caller that copies them (rsync).
  - With I(mode=manifest), only computes the manifest of the local directory I(src).
  - With I(verify=quick) (default), a file whose size and mtime match the record of its last
    verification in C(.flashfleet-manifest.json) is not hashed again; I(verify=full) hashes all.
options:
  src:
    description: C(s3://bucket/prefix), C(https://host/base/), or (mode=manifest) a local directory.
    type: str
  dest:
    description: Directory to stage into (preferred place).
    type: path
  fallback_dest:
    description: Where to stage when I(dest)'s file system lacks room.
    type: path
  verify:
    description: C(quick) trusts a file's last verification while its size and mtime are unchanged; C(full) re-hashes.
    type: str
    choices: [quick, full]
    default: quick
  fallback_policy:
    type: str
    choices: [warn, fail]
    default: warn
  free_margin_ratio:
    description: Free space to keep on I(dest)'s file system, as a fraction of the total size.
    type: float
    default: 0.1
  free_margin_bytes:
    description: Free space to keep at least, in bytes (the larger margin wins).
    type: int
    default: 0
  manifest:
    description: Expected files, C({relative path: {size: int, sha256: hex}}); pins the content.
    type: dict
  files:
    description: Relative names to fetch under an https base URL when no manifest is given.
    type: list
    elements: str
  concurrency:
    type: int
    default: 8
  endpoint_url:
    description: S3 endpoint (empty for AWS).
    type: str
  region:
    type: str
    default: us-east-1
  access_key:
    type: str
    no_log: true
  secret_key:
    type: str
    no_log: true
  session_token:
    type: str
    no_log: true
  verify_tls:
    type: bool
    default: true
  retries:
    description: Attempts per file before the module fails.
    type: int
    default: 3
  check_safetensors:
    description: Parse every *.safetensors header and check the shards against the index.
    type: bool
    default: false
  host_label:
    description: Name of the host in messages (the inventory name).
    type: str
  mode:
    type: str
    choices: [stage, manifest]
    default: stage
"""

RETURN = r"""
dest:
  description: Where the files are (I(dest) or I(fallback_dest)).
  type: str
placement:
  description: C(preferred) or C(fallback).
  type: str
counts:
  description: Files per action (skipped, downloaded, resumed, refetched).
  type: dict
bytes_transferred:
  type: int
seconds:
  type: float
throughput_bps:
  description: Bytes transferred per second of the transfer phase (0 when nothing moved).
  type: float
manifest:
  description: The manifest, C({path: {size, sha256}}).
  type: dict
missing:
  description: Verify-only mode, files absent or corrupt (deleted) in the destination.
  type: list
"""

MANIFEST_NAME = ".flashfleet-manifest.json"
PART_SUFFIX = ".flashfleet-part"
CHUNK = 1 << 20
AUTH_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "InvalidClientTokenId",
    "ExpiredToken",
    "InvalidToken",
    "AuthorizationHeaderMalformed",
    "403",
    "401",
}


class StageError(Exception):
    """A failure with a message fit for the user (host, problem, fix)."""


# --------------------------------------------------------------------------------------------
# Pure logic (unit-tested without a server)
# --------------------------------------------------------------------------------------------


def safe_relpath(rel):
    """Reject names that would escape the destination (absolute, '..', empty parts)."""
    if not rel or rel.startswith("/") or "\\" in rel:
        return False
    parts = rel.split("/")
    return all(p not in ("", ".", "..") for p in parts)


def parse_s3_url(url):
    """s3://bucket/prefix -> (bucket, prefix with a trailing slash or '')."""
    m = re.match(r"^s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?$", url)
    if not m:
        raise ValueError(f"not an s3://bucket/prefix URL: {url}")
    prefix = (m.group(2) or "").strip("/")
    return m.group(1), (prefix + "/" if prefix else "")


def normalize_manifest(manifest):
    """Validate a manifest dict; returns {rel: {'size': int, 'sha256': str|None}}."""
    out = {}
    for rel, ent in (manifest or {}).items():
        if not safe_relpath(rel):
            raise ValueError(f"manifest entry {rel!r} is not a safe relative path")
        if not isinstance(ent, dict) or "size" not in ent:
            raise ValueError(f"manifest entry {rel!r} needs a size")
        size = int(ent["size"])
        if size < 0:
            raise ValueError(f"manifest entry {rel!r} has a negative size")
        sha = ent.get("sha256")
        if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", str(sha).lower()):
            raise ValueError(f"manifest entry {rel!r} has a malformed sha256")
        out[rel] = {"size": size, "sha256": str(sha).lower() if sha else None}
    return out


def merge_expected(listing, given, recorded):
    """What each file must be.

    listing: {rel: {'size', 'etag'}} from the source (None when the source is not listed).
    given: the caller's manifest (pins content; the source must agree with it).
    recorded: the manifest written by an earlier run (trusted only while the source still has the
    same size and ETag for the file).
    Returns ({rel: {'size', 'sha256', 'etag'}}, [errors]).
    """
    errors = []
    expected = {}
    if given:
        for rel, ent in given.items():
            src = (listing or {}).get(rel)
            if listing is not None and src is None:
                errors.append(f"{rel}: in the manifest but not at the source")
                continue
            if src is not None and src["size"] != ent["size"]:
                errors.append(f"{rel}: the source has {src['size']} bytes, the manifest says {ent['size']}")
                continue
            expected[rel] = {"size": ent["size"], "sha256": ent["sha256"], "etag": (src or {}).get("etag")}
        return expected, errors
    for rel, src in (listing or {}).items():
        rec = (recorded or {}).get(rel)
        sha = None
        if rec and rec.get("size") == src["size"] and (rec.get("etag") or None) == (src.get("etag") or None):
            sha = rec.get("sha256")
        expected[rel] = {"size": src["size"], "sha256": sha, "etag": src.get("etag")}
    return expected, errors


def plan_file(expected_size, final_size, part_size):
    """Decide what to do with one file from what is on disk.

    final_size / part_size: size of the final file / of its partial file, or None when absent.
    Returns (action, offset): 'verify' (complete size: hash it), 'resume' from offset, or 'fetch'.
    A final file shorter than expected is a truncated download: it is resumed (its prefix is
    verified with the whole file's hash afterwards, and fetched again if that fails).
    """
    if final_size is not None:
        if final_size == expected_size:
            return "verify", 0
        if final_size < expected_size and final_size > 0:
            return "resume", final_size
        return "fetch", 0
    if part_size is not None and 0 < part_size < expected_size:
        return "resume", part_size
    return "fetch", 0


def etag_md5(etag):
    """A single-part S3 ETag is the object's MD5; multipart ETags ('...-N') are not."""
    if not etag:
        return None
    e = etag.strip('"').lower()
    return e if re.fullmatch(r"[0-9a-f]{32}", e) else None


def check_content(expected, sha256_hex, md5_hex):
    """None when the bytes match what is known of the file, else a reason."""
    if expected.get("sha256"):
        if sha256_hex != expected["sha256"]:
            return f"sha256 {sha256_hex[:12]}... != expected {expected['sha256'][:12]}..."
        return None
    want_md5 = etag_md5(expected.get("etag"))
    if want_md5 and md5_hex != want_md5:
        return f"md5 {md5_hex} != ETag {want_md5}"
    return None


def human(n):
    """Bytes as a short readable size (KiB to TiB)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def placement(total_bytes, present_bytes, free_bytes, margin_ratio, margin_bytes):
    """True when the preferred file system can take the rest of the files and keep the margin."""
    need = max(0, total_bytes - present_bytes)
    margin = max(int(total_bytes * margin_ratio), int(margin_bytes))
    return free_bytes - need >= margin, need, margin


DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


def parse_safetensors_header(head8, header_bytes, file_size):
    """Check one safetensors file's header; returns ({tensor: nbytes}, [errors])."""
    errors = []
    if len(head8) < 8:
        return {}, ["shorter than 8 bytes"]
    (n,) = struct.unpack("<Q", head8)
    if n > file_size - 8 or n > 100 * 1024 * 1024:
        return {}, [f"header length {n} does not fit in a {file_size}-byte file"]
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return {}, [f"header is not JSON ({e})"]
    if not isinstance(header, dict):
        return {}, ["header is not a JSON object"]
    data_len = file_size - 8 - n
    tensors = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            errors.append(f"{name}: malformed entry")
            continue
        if dtype not in DTYPE_BYTES:
            errors.append(f"{name}: unknown dtype {dtype}")
            continue
        count = 1
        for d in shape:
            count *= int(d)
        nbytes = count * DTYPE_BYTES[dtype]
        if not (0 <= start <= end <= data_len):
            errors.append(f"{name}: offsets {start}-{end} outside the {data_len}-byte data")
            continue
        if end - start != nbytes:
            errors.append(f"{name}: {end - start} bytes for {dtype}{list(shape)} which needs {nbytes}")
        tensors[name] = end - start
        spans.append((start, end))
    spans.sort()
    pos = 0
    for start, end in spans:
        if start != pos:
            errors.append(f"data not contiguous at byte {pos} (next tensor starts at {start})")
            break
        pos = end
    if not errors and pos != data_len:
        errors.append(f"tensors cover {pos} of {data_len} data bytes (truncated or padded file)")
    return tensors, errors


def read_safetensors(path):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head8 = f.read(8)
        if len(head8) < 8:
            return parse_safetensors_header(head8, b"", size)
        (n,) = struct.unpack("<Q", head8)
        if n > size - 8 or n > 100 * 1024 * 1024:
            return parse_safetensors_header(head8, b"", size)
        return parse_safetensors_header(head8, f.read(n), size)


def check_safetensors_dir(root):
    """Every shard parses; with an index, every tensor is in the shard the index names and the
    tensors' bytes add up to the index's total_size. Returns a list of errors."""
    errors = []
    shards = {}
    for dirpath, _dirs, files in os.walk(root):
        for fn in files:
            if fn.endswith(".safetensors"):
                p = os.path.join(dirpath, fn)
                rel = os.path.relpath(p, root)
                tensors, errs = read_safetensors(p)
                errors += [f"{rel}: {e}" for e in errs]
                shards[rel] = tensors
    index_path = os.path.join(root, "model.safetensors.index.json")
    if os.path.exists(index_path):
        try:
            with open(index_path) as f:
                index = json.load(f)
            weight_map = index["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            return errors + [f"model.safetensors.index.json: unreadable ({e})"]
        total = 0
        for tensor, shard in weight_map.items():
            if shard not in shards:
                errors.append(f"index names shard {shard} (for {tensor}), which is missing")
                continue
            if tensor not in shards[shard]:
                errors.append(f"index puts {tensor} in {shard}, whose header lacks it")
                continue
            total += shards[shard][tensor]
        want = (index.get("metadata") or {}).get("total_size")
        if want is not None and int(want) != total:
            errors.append(f"index total_size {want} != {total} bytes of tensors in the shards")
    return errors


def mtime_ns(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def still_verified(path, recorded_entry, want_sha):
    """Quick verify: the file is as it was when its recorded sha256 was computed (same size and
    mtime) and that sha256 is the one wanted now."""
    rec = recorded_entry or {}
    if not want_sha or rec.get("sha256") != want_sha or rec.get("mtime_ns") is None:
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_size == rec.get("size") and st.st_mtime_ns == rec["mtime_ns"]


def hash_file(path, limit=None):
    """sha256 and md5 of a file (its first `limit` bytes)."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    left = limit
    with open(path, "rb") as f:
        while True:
            n = CHUNK * 8 if left is None else min(CHUNK * 8, left)
            if n == 0:
                break
            buf = f.read(n)
            if not buf:
                break
            sha.update(buf)
            md5.update(buf)
            if left is not None:
                left -= len(buf)
    return sha, md5


def local_manifest(root):
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for fn in sorted(files):
            if fn == MANIFEST_NAME or fn.endswith(PART_SUFFIX):
                continue
            p = os.path.join(dirpath, fn)
            sha, _ = hash_file(p)
            out[os.path.relpath(p, root)] = {"size": os.path.getsize(p), "sha256": sha.hexdigest()}
    return out


def free_bytes_at(path):
    p = path
    while not os.path.exists(p):
        p = os.path.dirname(p) or "/"
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def present_bytes(root, expected):
    total = 0
    for rel, ent in expected.items():
        for cand in (os.path.join(root, rel), os.path.join(root, rel) + PART_SUFFIX):
            if os.path.exists(cand):
                total += min(os.path.getsize(cand), ent["size"])
                break
    return total


def read_recorded(root):
    try:
        with open(os.path.join(root, MANIFEST_NAME)) as f:
            data = json.load(f)
        return data.get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}


def write_manifest(root, source, files):
    data = {"source": source, "files": dict(sorted(files.items()))}
    path = os.path.join(root, MANIFEST_NAME)
    old = None
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError):
        pass
    if old == data:
        return False
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return True


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


class S3Source:
    def __init__(self, url, endpoint_url, region, access_key, secret_key, session_token, verify, concurrency, host):
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError as e:
            raise StageError(
                f"{host}: the interpreter running this module lacks boto3 ({e}); S3 sources need it. "
                "Fix: provision python_env first (its lock pins boto3) or point dataset_python at a "
                "Python that has boto3."
            ) from None
        self.exc = botocore.exceptions
        self.url = url
        self.bucket, self.prefix = parse_s3_url(url)
        self.endpoint = endpoint_url or "AWS S3 (default endpoint)"
        self.host = host
        cfg = botocore.config.Config(
            max_pool_connections=max(10, concurrency + 2),
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=15,
            read_timeout=120,
        )
        kwargs = {"region_name": region, "config": cfg, "verify": verify}
        if endpoint_url:
            kwargs["endpoint_url"] = endpoint_url
        if access_key:
            kwargs.update(aws_access_key_id=access_key, aws_secret_access_key=secret_key)
            if session_token:
                kwargs["aws_session_token"] = session_token
        self.client = boto3.session.Session().client("s3", **kwargs)

    def _explain(self, e):
        if isinstance(e, self.exc.NoCredentialsError):
            return StageError(
                f"{self.host}: no S3 credentials for {self.url} at {self.endpoint}. Fix: set "
                "dataset_s3_access_key and dataset_s3_secret_key (vaulted) in the inventory, or give "
                "the host an instance role."
            )
        if isinstance(e, self.exc.EndpointConnectionError | self.exc.ConnectTimeoutError):
            return StageError(
                f"{self.host}: cannot connect to the S3 endpoint {self.endpoint} ({type(e).__name__}). "
                "Fix: check dataset_s3_endpoint_url and that the host can reach it."
            )
        if isinstance(e, self.exc.ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in AUTH_CODES or status in ("401", "403"):
                return StageError(
                    f"{self.host}: the S3 endpoint {self.endpoint} rejected the credentials for "
                    f"{self.url} ({code or status}). Fix: check dataset_s3_access_key / "
                    "dataset_s3_secret_key (and session token) are the keys issued for this endpoint "
                    "and may read this bucket and prefix."
                )
            if code in ("NoSuchBucket", "404"):
                return StageError(
                    f"{self.host}: bucket '{self.bucket}' does not exist at {self.endpoint}. Fix: check "
                    "the source URL and dataset_s3_endpoint_url."
                )
            return StageError(f"{self.host}: S3 error at {self.endpoint} for {self.url}: {code} {err.get('Message', '')}")
        return StageError(f"{self.host}: S3 error at {self.endpoint} for {self.url}: {type(e).__name__}: {e}")

    def listing(self):
        out = {}
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    key = obj["Key"]
                    if key.endswith("/"):
                        continue
                    rel = key[len(self.prefix) :]
                    if not safe_relpath(rel):
                        raise StageError(f"{self.host}: object key {key!r} would escape the destination")
                    out[rel] = {"size": int(obj["Size"]), "etag": obj.get("ETag", "").strip('"') or None}
        except StageError:
            raise
        except Exception as e:  # botocore raises many types; all are explained the same way
            raise self._explain(e) from None
        if not out:
            raise StageError(
                f"{self.host}: no objects under {self.url} at {self.endpoint}. Fix: check the bucket and prefix."
            )
        return out

    def open_range(self, rel, offset):
        """Returns (stream, offset actually served)."""
        kw = {"Bucket": self.bucket, "Key": self.prefix + rel}
        if offset:
            kw["Range"] = f"bytes={offset}-"
        try:
            resp = self.client.get_object(**kw)
        except Exception as e:
            raise self._explain(e) from None
        served = offset if offset and resp.get("ContentRange") else 0
        return resp["Body"], served


class HttpSource:
    def __init__(self, url, verify, host):
        import ssl

        self.base = url if url.endswith("/") else url + "/"
        self.url = url
        self.host = host
        self.ctx = ssl.create_default_context()
        if not verify:
            self.ctx.check_hostname = False
            self.ctx.verify_mode = ssl.CERT_NONE

    def _open(self, rel, method="GET", offset=0):
        req = urllib.request.Request(self.base + urllib.parse.quote(rel), method=method)
        if offset:
            req.add_header("Range", f"bytes={offset}-")
        try:
            return urllib.request.urlopen(req, timeout=120, context=self.ctx)
        except urllib.error.HTTPError as e:
            fix = "check the credentials/URL" if e.code in (401, 403) else "check the URL"
            raise StageError(f"{self.host}: {self.base + rel} answered HTTP {e.code}. Fix: {fix}.") from None
        except (urllib.error.URLError, OSError) as e:
            raise StageError(f"{self.host}: cannot reach {self.base + rel} ({e}). Fix: check the URL and network.") from None

    def sizes(self, names):
        out = {}
        for rel in names:
            with self._open(rel, "HEAD") as r:
                length = r.headers.get("Content-Length")
            if length is None:
                raise StageError(f"{self.host}: {self.base + rel} gives no Content-Length; pass a manifest with sizes.")
            out[rel] = {"size": int(length), "etag": None}
        return out

    def open_range(self, rel, offset):
        r = self._open(rel, offset=offset)
        served = offset if (offset and r.status == 206) else 0
        return r, served


# --------------------------------------------------------------------------------------------
# Staging
# --------------------------------------------------------------------------------------------


def _download(source, rel, ent, root, action, offset, attempts):
    """Fetch one file into place; returns (action taken, bytes transferred, sha256 hex)."""
    final = os.path.join(root, rel)
    part = final + PART_SUFFIX
    os.makedirs(os.path.dirname(final), exist_ok=True)
    moved = 0
    taken = action
    last = None
    for _attempt in range(attempts):
        if action == "resume" and os.path.exists(final) and not os.path.exists(part):
            os.replace(final, part)
        if action != "resume":
            offset = 0
        body, served = source.open_range(rel, offset)
        if served != offset:
            offset = 0  # the server ignored the Range: start over
        sha, md5 = hash_file(part, offset) if offset else (hashlib.sha256(), hashlib.md5(usedforsecurity=False))
        with open(part, "r+b" if offset else "wb") as f:
            f.seek(offset)
            f.truncate()
            try:
                while True:
                    buf = body.read(CHUNK)
                    if not buf:
                        break
                    f.write(buf)
                    sha.update(buf)
                    md5.update(buf)
                    moved += len(buf)
            finally:
                body.close()
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        if size != ent["size"]:
            last = f"got {size} bytes, expected {ent['size']}"
            action, offset = ("resume", size) if 0 < size < ent["size"] else ("fetch", 0)
            continue
        why = check_content(ent, sha.hexdigest(), md5.hexdigest())
        if why is None:
            os.chmod(part, 0o644)
            os.replace(part, final)
            return taken, moved, sha.hexdigest()
        last = why
        os.unlink(part)
        action, offset, taken = "fetch", 0, "refetched"
    raise StageError(f"{rel}: still wrong after {attempts} attempts ({last})")


def stage(source, expected, root, concurrency, attempts, check_mode=False, recorded=None):
    """Bring root to `expected`. Returns (results {rel: (action, bytes, sha)}, seconds of transfer).
    recorded: the manifest of an earlier run, for quick verify (None: hash every present file)."""
    os.makedirs(root, exist_ok=True)
    results = {}
    todo = []

    def inspect(rel):
        ent = expected[rel]
        final = os.path.join(root, rel)
        part = final + PART_SUFFIX
        fsize = os.path.getsize(final) if os.path.isfile(final) else None
        psize = os.path.getsize(part) if os.path.isfile(part) else None
        action, offset = plan_file(ent["size"], fsize, psize)
        if action == "verify" and still_verified(final, (recorded or {}).get(rel), ent.get("sha256")):
            return rel, "skipped", 0, ent["sha256"]
        if action == "verify":
            sha, md5 = hash_file(final)
            if check_content(ent, sha.hexdigest(), md5.hexdigest()) is None:
                return rel, "skipped", 0, sha.hexdigest()
            return rel, "refetched", 0, None
        return rel, action, offset, None

    workers = max(1, min(concurrency, len(expected) or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for rel, action, offset, sha in pool.map(inspect, sorted(expected)):
            if action == "skipped":
                results[rel] = ("skipped", 0, sha)
            else:
                todo.append((rel, action, offset))
    start = time.monotonic()
    if check_mode:
        for rel, action, _ in todo:
            results[rel] = (action, 0, None)
        return results, 0.0
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futs = {}
        for rel, action, offset in todo:
            if action == "refetched":
                os.unlink(os.path.join(root, rel))
                act, off = "fetch", 0
            else:
                act, off = action, offset
            fut = pool.submit(_download, source, rel, expected[rel], root, act, off, attempts)
            futs[fut] = (rel, action)
        errors = []
        for fut in concurrent.futures.as_completed(futs):
            rel, planned = futs[fut]
            try:
                taken, moved, sha = fut.result()
            except StageError as e:
                errors.append(str(e))
                continue
            name = {"fetch": "downloaded", "resume": "resumed"}.get(planned, planned)
            if taken == "refetched":
                name = "refetched"
            results[rel] = (name, moved, sha)
    seconds = time.monotonic() - start
    if errors:
        raise StageError("; ".join(sorted(errors)))
    return results, seconds


def verify_only(expected, root, check_mode=False, recorded=None):
    """Verify root against expected; delete corrupt files; return (missing, manifest, changed).
    recorded: as for stage()."""
    missing, manifest, changed = [], {}, False
    for rel in sorted(expected):
        ent = expected[rel]
        p = os.path.join(root, rel)
        if still_verified(p, (recorded or {}).get(rel), ent.get("sha256")):
            manifest[rel] = {"size": ent["size"], "sha256": ent["sha256"], "mtime_ns": mtime_ns(p)}
            continue
        if os.path.isfile(p) and os.path.getsize(p) == ent["size"]:
            sha, md5 = hash_file(p)
            if check_content(ent, sha.hexdigest(), md5.hexdigest()) is None:
                manifest[rel] = {"size": ent["size"], "sha256": sha.hexdigest(), "mtime_ns": mtime_ns(p)}
                continue
            if not check_mode:
                os.unlink(p)
                changed = True
        missing.append(rel)
    return missing, manifest, changed


def run_module():
    # Imported here so that the staging logic above also runs as a plain library (benchmarks).
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="str"),
            dest=dict(type="path"),
            fallback_dest=dict(type="path"),
            fallback_policy=dict(type="str", choices=["warn", "fail"], default="warn"),
            free_margin_ratio=dict(type="float", default=0.1),
            free_margin_bytes=dict(type="int", default=0),
            manifest=dict(type="dict"),
            files=dict(type="list", elements="str"),
            concurrency=dict(type="int", default=8),
            endpoint_url=dict(type="str"),
            region=dict(type="str", default="us-east-1"),
            access_key=dict(type="str", no_log=True),
            secret_key=dict(type="str", no_log=True),
            session_token=dict(type="str", no_log=True),
            verify_tls=dict(type="bool", default=True),
            retries=dict(type="int", default=3),
            check_safetensors=dict(type="bool", default=False),
            host_label=dict(type="str"),
            mode=dict(type="str", choices=["stage", "manifest"], default="stage"),
            verify=dict(type="str", choices=["quick", "full"], default="quick"),
        ),
        required_together=[["access_key", "secret_key"]],
        supports_check_mode=True,
    )
    p = module.params
    host = p["host_label"] or socket.gethostname()

    if p["mode"] == "manifest":
        if not p["src"] or not os.path.isdir(p["src"]):
            module.fail_json(msg=f"mode=manifest needs src to be a local directory, got {p['src']!r}")
        m = local_manifest(p["src"])
        module.exit_json(changed=False, manifest=m, total_bytes=sum(e["size"] for e in m.values()))

    if not p["dest"]:
        module.fail_json(msg="dest is required")
    if not 1 <= p["concurrency"] <= 256:
        module.fail_json(msg=f"{host}: concurrency {p['concurrency']} is outside 1-256")
    try:
        given = normalize_manifest(p["manifest"])
    except ValueError as e:
        module.fail_json(msg=f"{host}: bad manifest: {e}")

    src = p["src"]
    try:
        if src is None:
            source, listing = None, None
            if not given:
                raise StageError(f"{host}: verify-only staging (no src) needs a manifest")
        elif src.startswith("s3://"):
            source = S3Source(
                src, p["endpoint_url"], p["region"], p["access_key"], p["secret_key"],
                p["session_token"], p["verify_tls"], p["concurrency"], host,
            )  # fmt: skip
            listing = source.listing()
        elif src.startswith(("https://", "http://")):
            source = HttpSource(src, p["verify_tls"], host)
            names = sorted(given) if given else (p["files"] or [])
            if not names:
                raise StageError(f"{host}: {src}: an https source needs a manifest or a files list (it cannot be listed)")
            for n in names:
                if not safe_relpath(n):
                    raise StageError(f"{host}: {n!r} is not a safe relative path")
            listing = None if given else source.sizes(names)
        else:
            raise StageError(f"{host}: unsupported source {src!r}; use s3://bucket/prefix or https://...")

        # Where to put it.
        dest, place, warnings = p["dest"], "preferred", []
        if p["fallback_dest"]:
            recorded_pref = read_recorded(dest)
            expected_pref, errors = merge_expected(listing, given, recorded_pref)
            if errors:
                raise StageError(f"{host}: source {src} disagrees with the manifest: " + "; ".join(errors))
            total = sum(e["size"] for e in expected_pref.values())
            present = present_bytes(dest, expected_pref)
            free = free_bytes_at(dest)
            fits, need, margin = placement(total, present, free, p["free_margin_ratio"], p["free_margin_bytes"])
            if not fits:
                msg = (
                    f"{host}: {human(total)} does not fit in {dest} with the margin "
                    f"({human(free)} free, {human(need)} still to write, {human(margin)} to keep "
                    "free): staged to {p['fallback_dest']} on disk instead, "
                    "which loads slower. Fix: enlarge that tmpfs (e.g. a bigger /dev/shm) or stage less"
                )
                if p["fallback_policy"] == "fail":
                    raise StageError(msg + "; dataset_model_shm_required is true, so this is an error.")
                warnings.append(msg + "; set dataset_model_shm_required: true to make this an error.")
                dest, place = p["fallback_dest"], "fallback"

        recorded = read_recorded(dest)
        expected, errors = merge_expected(listing, given, recorded)
        trusted = recorded if p["verify"] == "quick" else None
        if errors:
            raise StageError(f"{host}: source {src} disagrees with the manifest: " + "; ".join(errors))

        if source is None:
            missing, manifest, changed = verify_only(expected, dest, module.check_mode, trusted)
            if not missing and not module.check_mode:
                os.makedirs(dest, exist_ok=True)
                changed = write_manifest(dest, "copied", manifest) or changed
                errs = check_safetensors_dir(dest) if p["check_safetensors"] else []
                if errs:
                    raise StageError(f"{host}: safetensors check failed in {dest}: " + "; ".join(errs[:10]))
            for w in warnings:
                module.warn(w)
            module.exit_json(changed=changed, dest=dest, placement=place, missing=missing, manifest=manifest)

        results, seconds = stage(source, expected, dest, p["concurrency"], p["retries"], module.check_mode, trusted)
    except StageError as e:
        module.fail_json(msg=str(e))

    counts = {"skipped": 0, "downloaded": 0, "resumed": 0, "refetched": 0}
    moved = 0
    for action, nbytes, _sha in results.values():
        counts[action] = counts.get(action, 0) + 1
        moved += nbytes
    changed = any(a != "skipped" for a, _, _ in results.values())
    manifest = {
        rel: {"size": expected[rel]["size"], "sha256": sha, "etag": expected[rel].get("etag"),
              "mtime_ns": mtime_ns(os.path.join(dest, rel))}
        for rel, (_a, _b, sha) in results.items()
        if sha
    }
    for w in warnings:
        module.warn(w)
    if not module.check_mode:
        changed = write_manifest(dest, src, manifest) or changed
        if p["check_safetensors"]:
            errs = check_safetensors_dir(dest)
            if errs:
                module.fail_json(
                    msg=f"{host}: safetensors check failed in {dest}: " + "; ".join(errs[:10])
                    + ". Fix: the source model is damaged or incomplete; re-upload it.",
                    dest=dest,
                )
    module.exit_json(
        changed=changed,
        dest=dest,
        placement=place,
        counts=counts,
        bytes_transferred=moved,
        total_bytes=sum(e["size"] for e in expected.values()),
        seconds=round(seconds, 3),
        throughput_bps=round(moved / seconds, 1) if moved and seconds > 0 else 0.0,
        manifest={k: {"size": v["size"], "sha256": v["sha256"]} for k, v in manifest.items()},
    )


def main():
    run_module()


if __name__ == "__main__":
    main()


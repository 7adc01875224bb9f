"""Stage a dataset or a model onto a host: parallel, verified, resumable, idempotent (the logic of
the dataset role's module flashfleet_stage, which only declares its options and calls `run_module`).

Why a module: the real launches downloaded a dataset from S3 by hand, in parallel by hand, and
copied a 27B model to /dev/shm by hand (incidents.md). Done by tasks, every file would be a round
trip from the controller; here the host fetches straight from the source with a thread pool, so
the data never passes through the controller and many files move at once.

Every file is checked against a manifest of sizes and sha256 (given by the caller, or written
beside the data after the first complete download). A file that is complete and verified is
skipped, so a second run transfers nothing and reports changed=false. Re-hashing terabytes on every
run is what makes people stop running the role, so by default (verify=quick) a file whose size and
mtime are still those recorded when it was last hashed keeps that verification, as rsync and
`aws s3 sync` decide; verify=full hashes every file again (silent corruption, a clock set back). A
shorter file or a ``.part`` file is resumed with a Range request and then verified whole; a file
whose hash does not match is fetched again. S3 objects uploaded in one part carry their MD5 as
ETag, which is checked on the first download when no sha256 is known yet. Hashing is the
contract's (`contract.files.digests`), and so is the safetensors check of a staged model
(`contract.safetensors.check_dir`).

S3 access uses boto3 (any endpoint URL); the module must therefore run with an interpreter that
has boto3 (the trainer venv, whose lock pins it). https sources use only the standard library.
Credentials are module options marked no_log and never appear in results or messages.

Failures: every one is a StageError carrying host, file, problem and fix, which `run_module` turns
into fail_json; an OSError or anything unexpected becomes the same JSON, never a traceback. The
input is checked before anything is written (parameters, the destination's writability, the
source's listing or HEAD sizes against the manifest), so a refused run creates nothing. Only
transient network errors (timeouts, resets, 5xx) are retried; a size or checksum mismatch is
deterministic and fails at once, its `.part` removed (the bytes are still at the source; the
message names both sizes or hashes). A staged file whose content differs from the manifest is
replaced (or, without a source, listed for the caller's copy) only with repair=true; otherwise the
module fails naming it and leaves it as it is.
"""

import concurrent.futures
import errno
import hashlib
import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from .contract import files, safetensors

MANIFEST_NAME = ".flashfleet-manifest.json"
PART_SUFFIX = ".flashfleet-part"
CHUNK = 1 << 20
HASHES = ("sha256", "md5")  # md5: a single-part S3 ETag is the object's MD5
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


RETRY_BACKOFF_S = 1.0  # attempt n waits n times this after a transient error (tests set 0)
PROGRESS_EVERY_S = 2.0  # the progress file is rewritten at most this often during a transfer
PROGRESS_KEYS = ("bytes_done", "bytes_total", "files_done", "files_total", "file", "elapsed_s", "done")


class Progress:
    """A transfer's progress, for a person: the module's progress_file, rewritten atomically at most
    every PROGRESS_EVERY_S seconds while the files download (PROGRESS_KEYS: bytes moved of those to
    move, files done, the file that moved last, seconds, done). Ansible cannot stream a module's
    output, so the dataset role runs the module async and prints this file meanwhile. Best effort:
    a progress file that cannot be written stops being written, the staging goes on."""

    def __init__(self, path, files_total, bytes_total):
        self.path, self.lock, self.t0, self.last = path, threading.Lock(), time.monotonic(), 0.0
        self.rec = dict.fromkeys(PROGRESS_KEYS, 0) | {"bytes_total": bytes_total, "files_total": files_total,
                                                      "file": None, "done": False}
        self._write()

    def add(self, rel, n):
        with self.lock:
            self.rec["bytes_done"] += n
            self.rec["file"] = rel
            if time.monotonic() - self.last >= PROGRESS_EVERY_S:
                self._write()

    def file_done(self):
        with self.lock:
            self.rec["files_done"] += 1

    def finish(self):
        with self.lock:
            self.rec["done"] = True
            self._write()

    def _write(self):
        if self.path is None:
            return
        self.last = time.monotonic()
        self.rec["elapsed_s"] = round(self.last - self.t0, 1)
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            files.atomic_write_text(self.path, json.dumps(self.rec) + "\n")
        except OSError:
            self.path = None


class StageError(Exception):
    """A failure fit for the user: host, file (or directory, or source URL), problem, fix.
    str() is the one-line message; `result` (host, file, problem, fix and extras) goes to fail_json."""

    def __init__(self, host, file, problem, fix, **extra):
        self.host, self.file, self.problem, self.fix = host, file, problem, fix
        super().__init__(f"{host}: {file}: {problem}. Fix: {fix}" if file else f"{host}: {problem}. Fix: {fix}")
        self.result = {"host": host, "file": file, "problem": problem, "fix": fix, **extra}


class Transient(Exception):
    """A network failure worth another attempt (timeout, reset, refused connection, 5xx)."""


def os_error(host, exc, where=None):
    """An OSError as a StageError naming the path and the fix for its errno."""
    path = exc.filename or where
    why = exc.strerror or str(exc)
    fixes = {
        errno.EACCES: "run the task with become: true, or give this user write access there, or choose another dest",
        errno.EPERM: "run the task with become: true, or choose another dest",
        errno.EROFS: "choose a destination on a writable file system (or remount it read-write)",
        errno.ENOTDIR: "a path component is a file, not a directory: remove it or choose another dest",
        errno.EISDIR: "a directory is where a file must go: remove it or choose another dest",
        errno.EEXIST: "something is in the way: remove it or choose another dest",
        errno.ENOSPC: "free space on that file system or choose another dest",
        errno.EDQUOT: "raise the quota or choose another dest",
    }
    return StageError(host, path, why, fixes.get(exc.errno, "check that path and re-run"))


def dest_problem(host, path):
    """A StageError when the module could not write under `path`, else None. Reads only: the
    nearest existing ancestor must be a directory, writable, on a read-write file system."""
    target = os.path.abspath(path)
    probe = target
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        what = "is not a directory" if probe == target else f"is a file, not a directory, so {target} cannot be made"
        return StageError(host, probe, what, "remove or rename it, or choose another dest")
    if os.statvfs(probe).f_flag & os.ST_RDONLY:
        return StageError(host, probe, "is on a read-only file system",
                          "choose a destination on a writable file system (or remount it read-write)")
    if not os.access(probe, os.W_OK | os.X_OK):
        return StageError(host, probe, f"is not writable by uid {os.geteuid()} (permission denied)",
                          "run the task with become: true, or give this user write access there, or choose another dest")
    return None


# --------------------------------------------------------------------------------------------
# Pure logic (unit-tested without a server)
# --------------------------------------------------------------------------------------------


def safe_relpath(rel):
    """Reject names that would escape the destination (absolute, '..', empty parts)."""
    if not rel or rel.startswith("/") or "\\" in rel:
        return False
    parts = rel.split("/")
    return all(p not in ("", ".", "..") for p in parts)


# s3://bucket/prefix with an S3 bucket name (3-63 lower-case letters, digits, dots and hyphens).
S3_URL_RE = re.compile(r"^s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?$")


def parse_s3_url(url):
    """s3://bucket/prefix -> (bucket, prefix with a trailing slash or '')."""
    m = S3_URL_RE.match(url)
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

    listing: {rel: {'size', 'etag'}} from the source (None when the source is not listed; a size
    of None when the source did not say).
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
            if src is not None and src["size"] is not None and src["size"] != ent["size"]:
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


def local_manifest(root):
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for fn in sorted(names):
            if fn == MANIFEST_NAME or fn.endswith(PART_SUFFIX):
                continue
            p = os.path.join(dirpath, fn)
            out[os.path.relpath(p, root)] = {"size": os.path.getsize(p), "sha256": files.sha256(p)}
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


def write_manifest(root, source, entries):
    data = {"source": source, "files": dict(sorted(entries.items()))}
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


def _total_from_range(content_range):
    """The object's full size from a Content-Range header ('bytes 10-99/100'), or None."""
    m = re.match(r"^bytes \d+-\d+/(\d+)$", (content_range or "").strip())
    return int(m.group(1)) if m else None


class S3Source:
    def __init__(self, url, endpoint_url, region, access_key, secret_key, session_token, verify, concurrency, host):
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError as e:
            raise StageError(
                host, url, f"the interpreter running this module lacks boto3 ({e}); S3 sources need it",
                "provision python_env first (its lock pins boto3) or point dataset_python at a Python that has boto3",
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

    def _explain(self, e, what):
        """A botocore error as a StageError (deterministic) or Transient (worth another attempt)."""
        if isinstance(e, self.exc.NoCredentialsError):
            return StageError(self.host, what, f"no S3 credentials for {self.url} at {self.endpoint}",
                              "set dataset_s3_access_key and dataset_s3_secret_key (vaulted) in the inventory, "
                              "or give the host an instance role")
        if isinstance(e, self.exc.EndpointConnectionError | self.exc.ConnectTimeoutError | self.exc.ReadTimeoutError):
            return Transient(f"cannot connect to the S3 endpoint {self.endpoint} ({type(e).__name__})")
        if isinstance(e, self.exc.ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in AUTH_CODES or status in ("401", "403"):
                return StageError(
                    self.host, what, f"the S3 endpoint {self.endpoint} rejected the credentials for {self.url} "
                    f"({code or status})", "check dataset_s3_access_key / dataset_s3_secret_key (and session "
                    "token) are the keys issued for this endpoint and may read this bucket and prefix")
            if code == "NoSuchBucket" or (code == "404" and what == self.url):
                return StageError(self.host, what, f"bucket '{self.bucket}' does not exist at {self.endpoint}",
                                  "check the source URL and dataset_s3_endpoint_url")
            if code in ("NoSuchKey", "404"):
                return StageError(self.host, what, f"no such object under {self.url} at {self.endpoint}",
                                  "check the source URL and the manifest's file names")
            if status.startswith("5") or code in ("SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout"):
                return Transient(f"S3 {code or status} from {self.endpoint}")
            return StageError(self.host, what, f"S3 error at {self.endpoint}: {code} {err.get('Message', '')}".strip(),
                              "check the source URL, the endpoint and the keys")
        return Transient(f"S3 error at {self.endpoint}: {type(e).__name__}: {e}")

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
                        raise StageError(self.host, key, "this object key would escape the destination",
                                         "rename the object or stage a narrower prefix")
                    out[rel] = {"size": int(obj["Size"]), "etag": obj.get("ETag", "").strip('"') or None}
        except StageError:
            raise
        except Exception as e:  # botocore raises many types; all are explained the same way
            err = self._explain(e, self.url)
            if isinstance(err, Transient):  # boto3 has retried already: listing is not retried again
                err = StageError(self.host, self.url, str(err), "check dataset_s3_endpoint_url and that the host can reach it")
            raise err from None
        if not out:
            raise StageError(self.host, self.url, f"no objects under this prefix at {self.endpoint}",
                             "check the bucket and prefix")
        return out

    def open_range(self, rel, offset):
        """Returns (stream, offset actually served, the object's full size or None)."""
        kw = {"Bucket": self.bucket, "Key": self.prefix + rel}
        if offset:
            kw["Range"] = f"bytes={offset}-"
        try:
            resp = self.client.get_object(**kw)
        except Exception as e:
            raise self._explain(e, rel) from None
        served = offset if offset and resp.get("ContentRange") else 0
        total = _total_from_range(resp.get("ContentRange")) if served else resp.get("ContentLength")
        return resp["Body"], served, total


# HTTP answers worth another attempt; any other error status is final.
HTTP_TRANSIENT = {408, 425, 429, 500, 502, 503, 504}


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
        url = self.base + urllib.parse.quote(rel)
        req = urllib.request.Request(url, method=method)
        if offset:
            req.add_header("Range", f"bytes={offset}-")
        try:
            return urllib.request.urlopen(req, timeout=120, context=self.ctx)
        except urllib.error.HTTPError as e:
            e.close()
            if e.code in HTTP_TRANSIENT:
                raise Transient(f"{url} answered HTTP {e.code}") from None
            if e.code in (405, 501) and method == "HEAD":
                return None  # no HEAD here: the size is checked on the GET instead
            fix = "check the credentials and the URL" if e.code in (401, 403) else "check the URL and the file names"
            raise StageError(self.host, rel, f"{url} answered HTTP {e.code}", fix) from None
        except (urllib.error.URLError, OSError) as e:
            raise Transient(f"cannot reach {url} ({getattr(e, 'reason', e)})") from None

    def size(self, rel):
        """The file's size from a HEAD request (None when the server does not say)."""
        r = self._open(rel, "HEAD")
        if r is None:
            return None
        with r:
            length = r.headers.get("Content-Length")
        return int(length) if length is not None else None

    def sizes(self, names, attempts, workers, need_size):
        """{rel: {'size', 'etag'}} by HEAD, before anything is written; a 404 is a StageError."""

        def one(rel):
            size = _with_retries(lambda: self.size(rel), attempts, self.host, rel,
                                 "check the URL and that the host can reach it")
            if size is None and need_size:
                raise StageError(self.host, rel, f"{self.base + rel} gives no Content-Length",
                                 "pass a manifest with sizes")
            return rel, {"size": size, "etag": None}

        with concurrent.futures.ThreadPoolExecutor(max(1, min(workers, len(names)))) as pool:
            return dict(pool.map(one, names))

    def open_range(self, rel, offset):
        r = self._open(rel, offset=offset)
        served = offset if (offset and r.status == 206) else 0
        if served:
            total = _total_from_range(r.headers.get("Content-Range"))
        else:
            length = r.headers.get("Content-Length")
            total = int(length) if length is not None else None
        return r, served, total


def _with_retries(fn, attempts, host, file, fix):
    """fn() retried on Transient only (with a growing pause); the last Transient becomes a StageError."""
    last = None
    for attempt in range(attempts):
        if attempt:
            time.sleep(RETRY_BACKOFF_S * attempt)
        try:
            return fn()
        except Transient as e:
            last = e
    raise StageError(host, file, f"{attempts} attempt(s) failed: {last}", fix)


# --------------------------------------------------------------------------------------------
# Staging
# --------------------------------------------------------------------------------------------

NETWORK_FIX = "check the network and the source, then re-run: the partial file is kept and resumed"


def _read(body, n):
    """A chunk of the response; any failure of the stream is a network one."""
    try:
        return body.read(n)
    except Exception as e:  # urllib, http.client and botocore each raise their own types
        raise Transient(f"the transfer broke off ({type(e).__name__}: {e})") from None


def _download(source, rel, ent, root, action, offset, attempts, host="?", progress=None):
    """Fetch one file into place; returns (action taken, bytes transferred, sha256 hex).

    Transient network errors and a stream that ends early are retried (resuming); the source's
    size differing from the manifest is refused before a byte is written; a complete download
    whose hash is wrong is not retried (the same bytes would come again), unless its first part came
    from disk (a resume), which earns one full fetch. A mismatch removes its .part."""
    final = os.path.join(root, rel)
    part = final + PART_SUFFIX
    moved = 0
    taken = action
    last = None
    attempt = 0
    refetched_once = False
    while attempt < attempts:
        if attempt and last is not None:
            time.sleep(RETRY_BACKOFF_S * attempt)
        attempt += 1
        if action != "resume":
            offset = 0
        try:
            body, served, total = source.open_range(rel, offset)
        except Transient as e:
            last = str(e)
            continue
        if total is not None and total != ent["size"]:
            body.close()
            raise StageError(host, rel, f"the source has {total} bytes, the manifest says {ent['size']}; nothing "
                             "was written", "fix the manifest (mode=manifest on a good copy) or the source object")
        os.makedirs(os.path.dirname(final), exist_ok=True)
        if action == "resume" and os.path.exists(final) and not os.path.exists(part):
            os.replace(final, part)
        if served != offset:
            offset = 0  # the server ignored the Range: start over
        # A fresh download is hashed as it streams in; a resumed one is hashed whole once complete.
        streamed = None if offset else (hashlib.sha256(), hashlib.md5(usedforsecurity=False))
        broke, buf = None, b""
        with open(part, "r+b" if offset else "wb") as f:
            f.seek(offset)
            f.truncate()
            try:
                while True:
                    try:
                        buf = _read(body, CHUNK)
                    except Transient as e:
                        broke = str(e)
                        break
                    if not buf:
                        break
                    if f.tell() + len(buf) > ent["size"]:
                        break  # more than the manifest says: refused below, without writing past it
                    f.write(buf)
                    if streamed:
                        streamed[0].update(buf)
                        streamed[1].update(buf)
                    moved += len(buf)
                    if progress is not None:
                        progress.add(rel, len(buf))
            finally:
                body.close()
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        if broke is None and buf and size + len(buf) > ent["size"]:
            os.unlink(part)
            raise StageError(host, rel, f"the source sent more than the {ent['size']} bytes the manifest says; "
                             "the partial file was removed", "fix the manifest (mode=manifest on a good copy) "
                             "or the source object")
        if size < ent["size"]:
            # The stream ended early (a network failure): resume from what arrived.
            last = broke or f"the transfer ended at {size} of {ent['size']} bytes"
            action, offset = ("resume", size) if size > 0 else ("fetch", 0)
            continue
        if streamed:
            sha, md5 = streamed[0].hexdigest(), streamed[1].hexdigest()
        else:
            d = files.digests(part, HASHES)
            sha, md5 = d["sha256"], d["md5"]
        why = check_content(ent, sha, md5)
        if why is None:
            os.chmod(part, 0o644)
            os.replace(part, final)
            return taken, moved, sha
        os.unlink(part)
        if offset and not refetched_once:
            # The first bytes came from disk and may be the bad ones: one full fetch decides.
            refetched_once, last = True, None
            action, offset, taken = "fetch", 0, "refetched"
            attempt -= 1  # not a network failure: it uses no attempt
            continue
        raise StageError(host, rel, f"the downloaded bytes do not match ({why}); not retried: the source "
                         "would send the same bytes; the partial file was removed",
                         "fix the manifest (mode=manifest on a good copy) or re-upload the source object")
    raise StageError(host, rel, f"{attempts} attempt(s) failed: {last}", NETWORK_FIX)


def _mismatch_error(host, mismatched, fix, **extra):
    names = ", ".join(f"{rel} ({why})" for rel, why in mismatched[:10])
    more = f" and {len(mismatched) - 10} more" if len(mismatched) > 10 else ""
    return StageError(host, mismatched[0][0], f"{len(mismatched)} staged file(s) differ from the manifest: "
                      f"{names}{more}; left as they are", fix, mismatched=[rel for rel, _ in mismatched], **extra)


REPAIR_FIX = ("find out what changed them (they are left as they are); to replace them from the source, re-run "
              "with repair: true (the dataset role: -e dataset_repair=true)")


def stage(source, expected, root, concurrency, attempts, check_mode=False, recorded=None, repair=False, host="?",
          progress_file=None):
    """Bring root to `expected`. Returns (results {rel: (action, bytes, sha)}, seconds of transfer).
    recorded: the manifest of an earlier run, for quick verify (None: hash every present file).
    progress_file: where the transfer's Progress is written (None: nowhere).
    A present file of other content is fetched again only with repair; without it, nothing is
    transferred and the StageError lists those files. Directories are made only when a file arrives."""
    results = {}
    todo = []
    mismatched = []

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
            d = files.digests(final, HASHES)
            why = check_content(ent, d["sha256"], d["md5"])
            if why is None:
                return rel, "skipped", 0, d["sha256"]
            return rel, "refetched", 0, why
        if fsize is not None and fsize > ent["size"]:
            return rel, "refetched", 0, f"{fsize} bytes, the manifest says {ent['size']}"
        return rel, action, offset, None

    workers = max(1, min(concurrency, len(expected) or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for rel, action, offset, info in pool.map(inspect, sorted(expected)):
            if action == "skipped":
                results[rel] = ("skipped", 0, info)
            else:
                if action == "refetched":
                    mismatched.append((rel, info))
                todo.append((rel, action, offset))
    if mismatched and not repair:
        raise _mismatch_error(host, mismatched, REPAIR_FIX)
    start = time.monotonic()
    if check_mode:
        for rel, action, _ in todo:
            results[rel] = (action, 0, None)
        return results, 0.0
    progress = None
    if progress_file:
        progress = Progress(progress_file, len(todo), sum(
            expected[rel]["size"] - (offset if action == "resume" else 0) for rel, action, offset in todo))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futs = {}
        for rel, action, offset in todo:
            act, off = ("fetch", 0) if action == "refetched" else (action, offset)
            fut = pool.submit(_download, source, rel, expected[rel], root, act, off, attempts, host, progress)
            futs[fut] = (rel, action)
        errors = []
        for fut in concurrent.futures.as_completed(futs):
            rel, planned = futs[fut]
            if progress is not None:
                progress.file_done()
            try:
                taken, moved, sha = fut.result()
            except StageError as e:
                errors.append(e)
                continue
            except OSError as e:
                errors.append(os_error(host, e, os.path.join(root, rel)))
                continue
            name = {"fetch": "downloaded", "resume": "resumed"}.get(planned, planned)
            if taken == "refetched":
                name = "refetched"
            results[rel] = (name, moved, sha)
    if progress is not None:
        progress.finish()
    seconds = time.monotonic() - start
    if errors:
        errors.sort(key=lambda e: str(e.file))
        if len(errors) == 1:
            raise errors[0]
        first = errors[0]
        raise StageError(host, first.file, f"{len(errors)} files failed: " + "; ".join(
            f"{e.file}: {e.problem}" for e in errors), first.fix,
            failures=[{"file": e.file, "problem": e.problem, "fix": e.fix} for e in errors])
    return results, seconds


def verify_only(expected, root, recorded=None):
    """Verify root against expected, changing nothing; returns (missing, mismatched, manifest):
    absent or short files, files of other content [(rel, why)], and the verified ones' entries.
    recorded: as for stage()."""
    missing, mismatched, manifest = [], [], {}
    for rel in sorted(expected):
        ent = expected[rel]
        p = os.path.join(root, rel)
        if still_verified(p, (recorded or {}).get(rel), ent.get("sha256")):
            manifest[rel] = {"size": ent["size"], "sha256": ent["sha256"], "mtime_ns": mtime_ns(p)}
            continue
        size = os.path.getsize(p) if os.path.isfile(p) else None
        if size == ent["size"]:
            d = files.digests(p, HASHES)
            why = check_content(ent, d["sha256"], d["md5"])
            if why is None:
                manifest[rel] = {"size": ent["size"], "sha256": d["sha256"], "mtime_ns": mtime_ns(p)}
                continue
            mismatched.append((rel, why))
        elif size is not None and size > ent["size"]:
            mismatched.append((rel, f"{size} bytes, the manifest says {ent['size']}"))
        else:
            missing.append(rel)
    return missing, mismatched, manifest


# --------------------------------------------------------------------------------------------
# The module: its options in, its result out
# --------------------------------------------------------------------------------------------


def _check_safetensors(host, dest):
    errs = safetensors.check_dir(dest)
    if errs:
        raise StageError(host, dest, "safetensors check failed: " + "; ".join(errs[:10]),
                         "the source model is damaged or incomplete; re-upload it", dest=dest)


def _choose_place(p, host, listing, given):
    """(dest, placement, warning or None): the preferred dest unless its file system lacks room
    for the files plus the margin and a fallback_dest is given."""
    dest = p["dest"]
    if not p["fallback_dest"]:
        return dest, "preferred", None
    expected, errors = merge_expected(listing, given, read_recorded(dest))
    if errors:
        raise _disagree(host, p["src"], errors)
    total = sum(e["size"] for e in expected.values())
    free = free_bytes_at(dest)
    fits, need, margin = placement(total, present_bytes(dest, expected), free,
                                   p["free_margin_ratio"], p["free_margin_bytes"])
    if fits:
        return dest, "preferred", None
    why = (f"{human(total)} does not fit in {dest} with the margin ({human(free)} free, "
           f"{human(need)} still to write, {human(margin)} to keep free)")
    fix = "enlarge that tmpfs (e.g. a bigger /dev/shm) or stage less"
    if p["fallback_policy"] == "fail":
        raise StageError(host, dest, f"{why}; dataset_model_shm_required is true, so this is an error instead of "
                         f"staging to {p['fallback_dest']} on disk", fix)
    return p["fallback_dest"], "fallback", (
        f"{host}: {why}: staged to {p['fallback_dest']} on disk instead, which loads slower. Fix: {fix}; "
        "set dataset_model_shm_required: true to make this an error.")


def _disagree(host, src, errors):
    first = errors[0].split(":", 1)[0]
    return StageError(host, first, f"source {src} disagrees with the manifest: " + "; ".join(errors)
                      + "; nothing was written", "fix the manifest (mode=manifest on a good copy) or the source")


def setting_problems(concurrency, retries, free_margin_ratio, free_margin_bytes) -> list[tuple[str, str]]:
    """(what, fix) for each staging setting that cannot work. The module refuses the first; the
    dataset role's validation (its flashfleet_stage_setting_problems filter) lists them all before
    any host is touched."""
    problems = []
    if not 1 <= concurrency <= 256:
        problems.append((f"concurrency {concurrency} is outside 1-256", "set concurrency (dataset_concurrency) to 1-256"))
    if retries < 1:
        problems.append((f"retries {retries} is below 1", "set retries (dataset_retries) to 1 or more"))
    if not 0 <= free_margin_ratio < 1:
        problems.append((f"free_margin_ratio {free_margin_ratio} is outside [0, 1)",
                         "set free_margin_ratio (dataset_model_shm_margin_ratio) to a fraction below 1"))
    if free_margin_bytes < 0:
        problems.append((f"free_margin_bytes {free_margin_bytes} is negative",
                         "set free_margin_bytes (dataset_model_shm_min_free) to 0 or more"))
    return problems


def source_problem(src: str) -> str:
    """'' when `src` is a source the dataset role stages from (s3://bucket/prefix, https://... or an
    absolute controller path), else why not."""
    if S3_URL_RE.match(src) or re.match(r"^https?://.+", src) or re.match(r"^/.+", src):
        return ""
    return f"src '{src}' is not s3://bucket/prefix (a lower-case bucket name), https://... or an absolute controller path"


def _check_params(p, host):
    """Options that cannot work, refused before anything is read or written."""
    def bad(what, fix):  # named by the destination it would have written (nothing was)
        return StageError(host, p["dest"] or p["src"] or "(no dest)", what, fix)

    if not p["dest"]:
        raise bad("dest is required", "give dest, the directory to stage into")
    for key in ("dest", "fallback_dest"):
        if p[key] and not os.path.isabs(p[key]):
            raise bad(f"{key} {p[key]!r} is not an absolute path", f"give {key} as an absolute path")
    problems = setting_problems(p["concurrency"], p["retries"], p["free_margin_ratio"], p["free_margin_bytes"])
    if problems:
        raise bad(*problems[0])


def execute(p: dict, check_mode: bool = False, warn=lambda msg: None) -> dict:
    """Run the module with its parameters `p` (every option, as the argument spec fills them in):
    the result for exit_json; StageError (msg, .result) for fail_json. `warn` gets each warning.
    Everything is checked before anything is written: a refused run leaves dest as it was."""
    host = p["host_label"] or socket.gethostname()

    if p["mode"] == "manifest":
        if not p["src"] or not os.path.isdir(p["src"]):
            raise StageError(host, p["src"], "mode=manifest needs src to be a local directory",
                             "give src as a directory on this machine")
        m = local_manifest(p["src"])
        return {"changed": False, "manifest": m, "total_bytes": sum(e["size"] for e in m.values())}

    _check_params(p, host)
    try:
        given = normalize_manifest(p["manifest"])
    except (ValueError, TypeError) as e:
        raise StageError(host, p["dest"], f"bad manifest: {e}", "give manifest as {relative/path: {size: BYTES, "
                         "sha256: HEX}}") from None
    err = dest_problem(host, p["dest"])
    if err:
        raise err

    src = p["src"]
    if src is None:
        source, listing = None, None
        if not given:
            raise StageError(host, p["dest"], "verify-only staging (no src) needs a manifest",
                             "give src, or the manifest to verify against")
    elif src.startswith("s3://"):
        try:
            parse_s3_url(src)
        except ValueError as e:
            raise StageError(host, src, str(e), "give src as s3://bucket/prefix (a lower-case bucket name)") from None
        source = S3Source(
            src, p["endpoint_url"], p["region"], p["access_key"], p["secret_key"],
            p["session_token"], p["verify_tls"], p["concurrency"], host,
        )  # fmt: skip
        listing = source.listing()
    elif src.startswith(("https://", "http://")):
        source = HttpSource(src, p["verify_tls"], host)
        names = sorted(given) if given else (p["files"] or [])
        if not names:
            raise StageError(host, src, "an https source needs a manifest or a files list (it cannot be listed)",
                             "give manifest or files")
        for n in names:
            if not safe_relpath(n):
                raise StageError(host, n, "is not a safe relative path", "give names relative to the base URL, "
                                 "without '..' or a leading '/'")
        # HEAD every file first: a 404 or a size other than the manifest's is refused before any write.
        listing = source.sizes(names, p["retries"], p["concurrency"], need_size=not given)
    else:
        raise StageError(host, src, "unsupported source", "use s3://bucket/prefix or https://...")

    dest, place, warning = _choose_place(p, host, listing, given)
    err = place == "fallback" and dest_problem(host, dest)
    if err:
        raise err
    recorded = read_recorded(dest)
    expected, errors = merge_expected(listing, given, recorded)
    trusted = recorded if p["verify"] == "quick" else None
    if errors:
        raise _disagree(host, src, errors)

    if source is None:
        missing, mismatched, manifest = verify_only(expected, dest, trusted)
        if mismatched and not p["repair"]:
            raise _mismatch_error(host, mismatched, REPAIR_FIX.replace("from the source", "with the caller's copy"),
                                  dest=dest, placement=place, missing=missing)
        changed = False
        if not missing and not mismatched and not check_mode:
            os.makedirs(dest, exist_ok=True)
            changed = write_manifest(dest, "copied", manifest)
            if p["check_safetensors"]:
                _check_safetensors(host, dest)
        if warning:
            warn(warning)
        # With repair, the files of other content are listed with the missing ones for the caller
        # to copy over (rsync --checksum replaces them); nothing is deleted here.
        return {"changed": changed, "dest": dest, "placement": place,
                "missing": sorted(missing + [rel for rel, _ in mismatched]),
                "mismatched": [rel for rel, _ in mismatched], "manifest": manifest}

    results, seconds = stage(source, expected, dest, p["concurrency"], p["retries"], check_mode, trusted,
                             repair=p["repair"], host=host, progress_file=p.get("progress_file"))
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
    if warning:
        warn(warning)
    if not check_mode:
        os.makedirs(dest, exist_ok=True)
        changed = write_manifest(dest, src, manifest) or changed
        if p["check_safetensors"]:
            _check_safetensors(host, dest)
    return {
        "changed": changed,
        "dest": dest,
        "placement": place,
        "counts": counts,
        "bytes_transferred": moved,
        "total_bytes": sum(e["size"] for e in expected.values()),
        "seconds": round(seconds, 3),
        "throughput_bps": round(moved / seconds, 1) if moved and seconds > 0 else 0.0,
        "manifest": {k: {"size": v["size"], "sha256": v["sha256"]} for k, v in manifest.items()},
    }


def run_module(module) -> None:
    """The flashfleet_stage module's body, given its AnsibleModule. Every failure is fail_json
    with host, file, problem and fix: an OSError is named by its path, anything else by its type."""
    p = module.params
    host = p.get("host_label") or socket.gethostname()
    err = None
    try:
        result = execute(p, module.check_mode, module.warn)
    except StageError as e:
        err = e
    except OSError as e:
        err = os_error(host, e, p.get("dest"))
    except Exception as e:  # never a traceback: the answer is always the module's JSON
        err = StageError(host, p.get("dest") or p.get("src"), f"unexpected {type(e).__name__}: {e}",
                         "re-run with -vvv and report it as a flashfleet_stage bug with this message")
    if err is not None:  # outside the except block: fail_json would attach the traceback there
        module.fail_json(msg=str(err), **err.result)
    module.exit_json(**result)

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
"""

import concurrent.futures
import hashlib
import json
import os
import re
import socket
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


class StageError(Exception):
    """A failure with a message fit for the user (host, problem, fix); `result` goes with it."""

    def __init__(self, msg, **result):
        super().__init__(msg)
        self.result = result


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
        # A fresh download is hashed as it streams in; a resumed one is hashed whole once complete.
        streamed = None if offset else (hashlib.sha256(), hashlib.md5(usedforsecurity=False))
        with open(part, "r+b" if offset else "wb") as f:
            f.seek(offset)
            f.truncate()
            try:
                while True:
                    buf = body.read(CHUNK)
                    if not buf:
                        break
                    f.write(buf)
                    if streamed:
                        streamed[0].update(buf)
                        streamed[1].update(buf)
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
            d = files.digests(final, HASHES)
            if check_content(ent, d["sha256"], d["md5"]) is None:
                return rel, "skipped", 0, d["sha256"]
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
            d = files.digests(p, HASHES)
            if check_content(ent, d["sha256"], d["md5"]) is None:
                manifest[rel] = {"size": ent["size"], "sha256": d["sha256"], "mtime_ns": mtime_ns(p)}
                continue
            if not check_mode:
                os.unlink(p)
                changed = True
        missing.append(rel)
    return missing, manifest, changed



# --------------------------------------------------------------------------------------------
# The module: its options in, its result out
# --------------------------------------------------------------------------------------------


def _check_safetensors(host, dest):
    errs = safetensors.check_dir(dest)
    if errs:
        raise StageError(f"{host}: safetensors check failed in {dest}: " + "; ".join(errs[:10])
                         + ". Fix: the source model is damaged or incomplete; re-upload it.", dest=dest)


def _choose_place(p, host, listing, given):
    """(dest, placement, warning or None): the preferred dest unless its file system lacks room
    for the files plus the margin and a fallback_dest is given."""
    dest = p["dest"]
    if not p["fallback_dest"]:
        return dest, "preferred", None
    expected, errors = merge_expected(listing, given, read_recorded(dest))
    if errors:
        raise StageError(f"{host}: source {p['src']} disagrees with the manifest: " + "; ".join(errors))
    total = sum(e["size"] for e in expected.values())
    free = free_bytes_at(dest)
    fits, need, margin = placement(total, present_bytes(dest, expected), free,
                                   p["free_margin_ratio"], p["free_margin_bytes"])
    if fits:
        return dest, "preferred", None
    why = (f"{host}: {human(total)} does not fit in {dest} with the margin ({human(free)} free, "
           f"{human(need)} still to write, {human(margin)} to keep free)")
    fix = "Fix: enlarge that tmpfs (e.g. a bigger /dev/shm) or stage less"
    if p["fallback_policy"] == "fail":
        raise StageError(f"{why}; dataset_model_shm_required is true, so this is an error instead of "
                         f"staging to {p['fallback_dest']} on disk. {fix}.")
    return p["fallback_dest"], "fallback", (
        f"{why}: staged to {p['fallback_dest']} on disk instead, which loads slower. {fix}; "
        "set dataset_model_shm_required: true to make this an error.")


def execute(p: dict, check_mode: bool = False, warn=lambda msg: None) -> dict:
    """Run the module with its parameters `p` (every option, as the argument spec fills them in):
    the result for exit_json; StageError (msg, .result) for fail_json. `warn` gets each warning."""
    host = p["host_label"] or socket.gethostname()

    if p["mode"] == "manifest":
        if not p["src"] or not os.path.isdir(p["src"]):
            raise StageError(f"mode=manifest needs src to be a local directory, got {p['src']!r}")
        m = local_manifest(p["src"])
        return {"changed": False, "manifest": m, "total_bytes": sum(e["size"] for e in m.values())}

    if not p["dest"]:
        raise StageError("dest is required")
    if not 1 <= p["concurrency"] <= 256:
        raise StageError(f"{host}: concurrency {p['concurrency']} is outside 1-256")
    try:
        given = normalize_manifest(p["manifest"])
    except ValueError as e:
        raise StageError(f"{host}: bad manifest: {e}") from None

    src = p["src"]
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

    dest, place, warning = _choose_place(p, host, listing, given)
    recorded = read_recorded(dest)
    expected, errors = merge_expected(listing, given, recorded)
    trusted = recorded if p["verify"] == "quick" else None
    if errors:
        raise StageError(f"{host}: source {src} disagrees with the manifest: " + "; ".join(errors))

    if source is None:
        missing, manifest, changed = verify_only(expected, dest, check_mode, trusted)
        if not missing and not check_mode:
            os.makedirs(dest, exist_ok=True)
            changed = write_manifest(dest, "copied", manifest) or changed
            if p["check_safetensors"]:
                _check_safetensors(host, dest)
        if warning:
            warn(warning)
        return {"changed": changed, "dest": dest, "placement": place, "missing": missing, "manifest": manifest}

    results, seconds = stage(source, expected, dest, p["concurrency"], p["retries"], check_mode, trusted)
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
    """The flashfleet_stage module's body, given its AnsibleModule."""
    try:
        result = execute(module.params, module.check_mode, module.warn)
    except StageError as e:
        module.fail_json(msg=str(e), **e.result)
    module.exit_json(**result)

"""File primitives every writer and reader of the contract shares: hashing, fsync, atomic writes,
JSON reads that name the file."""

import hashlib
import json
import os

CHUNK = 1 << 20


def digests(path, algorithms=("sha256",), limit=None) -> dict:
    """{algorithm: hexdigest} of a file (of its first `limit` bytes), reading it once."""
    hs = {a: hashlib.new(a, usedforsecurity=False) if a == "md5" else hashlib.new(a) for a in algorithms}
    left = limit
    with open(path, "rb") as f:
        while left is None or left > 0:
            buf = f.read(CHUNK * 8 if left is None else min(CHUNK * 8, left))
            if not buf:
                break
            for h in hs.values():
                h.update(buf)
            if left is not None:
                left -= len(buf)
    return {a: h.hexdigest() for a, h in hs.items()}


def sha256(path) -> str:
    """The sha256 hex digest of a file."""
    return digests(path)["sha256"]


def fsync_file(path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path, text: str) -> None:
    """Write text via a temp file in the same directory, fsync, rename, fsync the directory:
    a reader sees the old file or the new one, never half of one, even after SIGKILL."""
    path = os.fspath(path)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def load_json(path, error: type[Exception]):
    """The JSON document at path; `error` (the reader's own exception) names the file and the problem."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as exc:
        raise error(f"{path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise error(f"{path}: not JSON ({exc})") from exc

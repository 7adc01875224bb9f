"""The run's on-host contract (module_utils/flashfleet/contract): each rule, and that the package
stays standard-library only (Ansible ships it to hosts whose system Python has nothing else)."""

import ast
import json
import math
import re
import struct
import sys
from pathlib import Path

import pytest
from flashfleet.contract import checkpoint, files, layout, locks, messages, metrics, safetensors, status

from tests.conftest import ROOT

PACKAGE = ROOT / "module_utils" / "flashfleet"


def _imports(tree, everywhere: bool) -> list[str]:
    nodes = ast.walk(tree) if everywhere else tree.body
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module)
    return names


def test_package_imports_only_the_standard_library_and_itself():
    """The contract: the standard library everywhere. The rest of the package: at module level
    (an optional client such as boto3 may be imported where it is used, with its own error)."""
    bad = []
    for path in PACKAGE.rglob("*.py"):
        in_contract = path.parent.name == "contract"
        bad += [f"{path.relative_to(ROOT)}: {n}" for n in _imports(ast.parse(path.read_text()), in_contract)
                if n.split(".")[0] not in sys.stdlib_module_names]
    assert not bad, bad


# ---- locks -------------------------------------------------------------------------------------
def test_lock_rules():
    text = ("# a comment\n--index-url https://example.com/simple\n"
            "Torch==2.13.0+cpu \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n"
            "pydantic_core[extra]==2.27.1 ; python_version >= '3.9'  # via pydantic\n"
            "wandb===0.19.1\n\n")
    assert locks.parse(text) == {"torch": "2.13.0+cpu", "pydantic-core": "2.27.1", "wandb": "0.19.1"}


@pytest.mark.parametrize("text, line", [("six==1.16.0\nwandb>=0.19\n", 2), ("six\n", 1), ("a==1\n b @ file:///x\n", 2)])
def test_lock_line_that_is_not_a_pin_is_named(text, line):
    with pytest.raises(ValueError, match=f"line {line} is not a name==version pin"):
        locks.parse(text)


def test_lock_without_pins_is_an_error():
    with pytest.raises(ValueError, match="no pins"):
        locks.parse("# nothing\n")


def test_every_project_lock_parses():
    for lock in (ROOT / "requirements").glob("*.lock"):
        assert len(locks.parse(lock.read_text())) > 10, lock


def test_versions_compare_as_pip_installs_them():
    assert locks.same_version("2.13.0", "2.13.0+cpu")
    assert locks.same_version("2.13.0+cpu", "2.13.0+cpu")
    assert not locks.same_version("2.13.0+cpu", "2.13.0")
    assert not locks.same_version("2.13.0", "2.13.1")
    assert not locks.same_version("2.13.0", None)


def test_compare_lists_missing_other_and_extra_packages():
    drift = locks.compare({"torch": "2.13.0", "wandb": "0.19.1", "six": "1.16.0"},
                          {"Torch": "2.13.0+cpu", "wandb": "0.22.0", "extra-pkg": "1.0", "pip": "24"}, ignore=["pip"])
    assert drift == [{"package": "six", "locked": "1.16.0", "installed": None},
                     {"package": "wandb", "locked": "0.19.1", "installed": "0.22.0"},
                     {"package": "extra-pkg", "locked": None, "installed": "1.0"}]
    assert locks.table([]) == "venv matches the lock"
    assert "(missing)" in locks.table(drift) and "(not locked)" in locks.table(drift)


# ---- safetensors and checkpoints ---------------------------------------------------------------
def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A valid safetensors file, built from the format alone (no library)."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = math.prod(shape) * safetensors.DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x01" * offset)


def test_safetensors_header_check(tmp_path):
    f = tmp_path / "w.safetensors"
    write_safetensors(f, {"a": ("F32", [2, 3]), "b": ("BF16", [4])})
    tensors, problems = safetensors.read_header(f)
    assert problems == [] and tensors["a"] == {"dtype": "F32", "shape": [2, 3], "nbytes": 24}
    f.write_bytes(f.read_bytes()[:-1])
    assert "b: offsets 24-32 outside the 31-byte data" in safetensors.read_header(f)[1]
    f.write_bytes(f.read_bytes() + b"\0\0")
    assert "tensors cover 32 of 33 data bytes (truncated or padded file)" in safetensors.read_header(f)[1]
    f.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    assert "does not fit" in safetensors.read_header(f)[1][0]
    f.write_bytes(b"\x01")
    assert "shorter than" in safetensors.read_header(f)[1][0]
    assert "unreadable" in safetensors.read_header(tmp_path / "missing")[1][0]


def test_safetensors_dir_with_index(tmp_path):
    write_safetensors(tmp_path / "model-1.safetensors", {"a": ("F32", [2])})
    index = {"metadata": {"total_size": 8}, "weight_map": {"a": "model-1.safetensors"}}
    (tmp_path / safetensors.INDEX).write_text(json.dumps(index))
    assert safetensors.check_dir(tmp_path) == []
    index["weight_map"]["b"] = "model-2.safetensors"
    index["metadata"]["total_size"] = 9
    (tmp_path / safetensors.INDEX).write_text(json.dumps(index))
    problems = safetensors.check_dir(tmp_path)
    assert any("model-2.safetensors" in p and "missing" in p for p in problems)
    assert any("total_size 9" in p for p in problems)


def make_checkpoint(root: Path, step: int) -> Path:
    d = root / checkpoint.step_dir_name(step)
    d.mkdir(parents=True)
    write_safetensors(d / checkpoint.WEIGHTS, {"w": ("F32", [4])})
    (d / checkpoint.CONFIG).write_text("{}\n")
    (d / checkpoint.STATE).write_bytes(b"state")
    checkpoint.write_manifest(d, step)
    return d


def test_checkpoint_names():
    assert checkpoint.step_dir_name(12) == "step-00000012" and checkpoint.step_of("step-00000012") == 12
    assert checkpoint.step_of("step-12") is None and checkpoint.step_of("step-00000012.old") is None
    assert checkpoint.temp_pid(checkpoint.temp_dir_name(3, 4242)) == 4242 and checkpoint.temp_pid("step-3") is None


def test_checkpoint_verify(tmp_path):
    d = make_checkpoint(tmp_path, 5)
    assert checkpoint.verify(d) == []
    weights = d / checkpoint.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, other content: only the hash sees it
    weights.write_bytes(bytes(data))
    assert checkpoint.verify(d, check_hashes=False) == []
    assert checkpoint.verify(d) == [f"{checkpoint.WEIGHTS}: sha256 differs from the manifest"]
    weights.write_bytes(bytes(data[:-2]))
    assert "bytes, manifest says" in checkpoint.verify(d, check_hashes=False)[0]
    (d / checkpoint.MANIFEST).unlink()
    assert checkpoint.verify(d)[0].startswith("no manifest.json")


def test_checkpoint_whose_manifest_lists_other_files_is_not_complete(tmp_path):
    d = make_checkpoint(tmp_path, 1)
    m = json.loads((d / checkpoint.MANIFEST).read_text())
    m["files"].pop(checkpoint.STATE)
    (d / checkpoint.MANIFEST).write_text(json.dumps(m))
    assert "lists" in checkpoint.verify(d)[0]


def test_weights_truncated_with_a_matching_manifest_is_caught_by_the_header(tmp_path):
    d = make_checkpoint(tmp_path, 1)
    w = d / checkpoint.WEIGHTS
    w.write_bytes(w.read_bytes()[:-4])
    checkpoint.write_manifest(d, 1)  # a manifest written after the damage
    assert checkpoint.verify(d) == [f"{checkpoint.WEIGHTS}: w: offsets 0-16 outside the 12-byte data"]


def test_scan_and_newest_complete(tmp_path):
    make_checkpoint(tmp_path, 1)
    make_checkpoint(tmp_path, 2)
    newest = make_checkpoint(tmp_path, 3)
    (tmp_path / checkpoint.temp_dir_name(4, 99999)).mkdir()
    (tmp_path / "notes").mkdir()
    rows = checkpoint.scan(tmp_path)
    assert [(r["step"], r["in_progress"]) for r in rows] == [(1, False), (2, False), (3, False), (4, True)]
    assert rows[-1]["pid"] == 99999 and rows[-1]["problems"]
    assert checkpoint.newest_complete(tmp_path) == str(newest)
    (newest / checkpoint.STATE).write_bytes(b"STATE")  # corrupt, same size
    assert checkpoint.newest_complete(tmp_path).endswith("step-00000002")
    assert checkpoint.scan(tmp_path / "absent") == []


# ---- status, metrics, messages, layout ---------------------------------------------------------
def test_status_round_trip(tmp_path):
    path = tmp_path / layout.STATUS
    rec = status.new(pid=7)
    rec["loss"] = float("nan")
    status.write(path, rec)
    back = status.read(path)
    assert back["phase"] == "loading" and back["pid"] == 7 and back["loss"] is None
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind


def test_status_refuses_what_is_not_a_status(tmp_path):
    path = tmp_path / layout.STATUS
    with pytest.raises(ValueError, match="unknown phase"):
        status.write(path, {"phase": "exploded"})
    assert not path.exists()
    for text, problem in (("[1]", "not a JSON object"), ("{", "not JSON"), ('{"phase": "x"}', "unknown phase")):
        path.write_text(text)
        with pytest.raises(status.StatusError, match=problem):
            status.read(path)
    with pytest.raises(status.StatusError, match=re.escape(str(tmp_path / "none.json"))):
        status.read(tmp_path / "none.json")


def test_metrics_reader_skips_lines_a_crash_cut(tmp_path):
    path = tmp_path / layout.METRICS
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n\xff\xfe garbage\n[1]\n{"step": 2, "tau": 3.5}\n{"step": 3, "lo')
    recs = metrics.read(path)
    assert recs == [{"step": 1, "loss": 2.0}, {"step": 2, "tau": 3.5}]
    assert [metrics.is_step(r) for r in recs] == [True, False]
    assert metrics.read(path, tail_bytes=41) == [{"step": 2, "tau": 3.5}]


def test_message_patterns_match_what_the_trainer_prints():
    line = messages.config_error("--lr -1 is negative", "use a positive learning rate")
    assert line == "flashfleet-train: config error: --lr -1 is negative (fix: use a positive learning rate)"
    assert messages.CONFIG_ERROR_RE.fullmatch(line) and re.match(messages.START_FAILURE_PATTERN, line)
    peer = messages.error(messages.went_first(0, 1, "node 1 stopped heartbeating"))
    assert messages.PEER_FAILURE_RE.match(peer)
    assert messages.PEER_FAILURE_RE.match(messages.error(messages.also_went_first("node 0: rank 0 exited", 2, "x")))
    assert not messages.PEER_FAILURE_RE.match(messages.error("node 0: drafter rank 0 exited with code 1"))
    assert re.match(messages.START_FAILURE_PATTERN, "torch.OutOfMemoryError: CUDA out of memory")
    assert not re.match(messages.START_FAILURE_PATTERN, "loading target 3/7")


def test_trainer_prints_the_contract_line():
    from flashfleet.contract.messages import EX_CONFIG
    from flashfleet_trainer.errors import ConfigError

    assert EX_CONFIG == messages.EX_CONFIG == 78
    assert ConfigError("what", "fix").line() == messages.config_error("what", "fix")


def test_unit_name_and_atomic_write(tmp_path):
    assert layout.unit_name("v2") == "flashfleet-train@v2.service"
    assert layout.RUN_NAME_RE.match("v2.1_a") and not layout.RUN_NAME_RE.match("-v2")
    files.atomic_write_text(tmp_path / "x", "one")
    files.atomic_write_text(tmp_path / "x", "two")
    assert (tmp_path / "x").read_text() == "two" and len(list(tmp_path.iterdir())) == 1
    assert files.digests(tmp_path / "x", ("sha256", "md5"), limit=1)["md5"] == "e358efa489f58062f10dd7316b65649e"

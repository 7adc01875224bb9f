"""Bad input is refused on the controller with one message that names the problem and the fix,
never a Python traceback: run entries of flashfleet_runs (the run plan's flashfleet.plan.entry, which check_run.yml runs
before any host is touched; the same through the playbooks: tests/playbooks/test_check_run_generated.py), and the offline tools on damaged
files: flashfleet-classify RUNS_DIR classifies every host whose evidence it can read and makes the
others `no-evidence` rows naming the file; flashfleet-report RUN_DIR builds the report from what is
readable, naming each damaged file in one warning line, or refuses the directory in one line.

Hypothesis generates the malformed input from the schema the checker itself declares (FIELDS,
SUBFIELDS), so a field added there is fuzzed too.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import flashfleet.classify as fc
import flashfleet.plan.entry as entries
import flashfleet.report as fr
import pytest
from flashfleet.classify import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, examples

FAST = settings(max_examples=examples(10), suppress_health_check=[HealthCheck.too_slow])

# Any value YAML or JSON can give a field.
values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                      max_leaves=8)
names = st.from_regex(entries.layout.RUN_NAME_RE, fullmatch=True).filter(lambda n: len(n) < 60)
GOOD = {"hosts": ["ct200"], "trainer": {"target_model": "/m", "drafter_gpus": "4"}, "rdma": False,
        "resources": {"start_timeout_s": 60, "oom_policy": "stop"}, "wandb": {"project": "p", "settings": {}},
        "webhook": {"url": "https://hooks.example.org/x"}, "nccl": {"NCCL_SOCKET_IFNAME": "ens1"},
        "vllm": {"servers": [{"port": 8100, "gpus": "0,1"}, {"port": 8101, "gpus": "2,3"}], "args": {}}}


def test_the_checked_fields_are_the_role_argument_specs():
    """The checker's FIELDS name exactly the fields train_unit's argument spec accepts in a run entry."""
    import yaml
    spec = yaml.safe_load((ROOT / "roles/train_unit/meta/argument_specs.yml").read_text())
    fields = spec["argument_specs"]["main"]["options"]["train_unit_spec"]["options"]
    assert set(entries.FIELDS) == set(fields)


def problems(name, entry):
    return entries.run_problems([name], {name: entry})


def _wrong(kind):
    """Values that are not of the kind (the checker's own test decides)."""
    return values.filter(lambda v: not entries.KINDS[kind][0](v))


def _refused(found, name, field):
    """One or more messages, every one naming the run, the field's and a fix."""
    assert found and all(m.startswith(f"run {name}: ") for m in found), found
    path = f"flashfleet_runs.{name}" + (f".{field}" if field else "")
    assert any(path in m and ("e.g." in m or "remove" in m) for m in found), found


def test_the_shipped_inventories_and_a_full_entry_are_accepted():
    import yaml
    for inv in ("example", "local"):
        runs = yaml.safe_load((ROOT / f"inventory/{inv}/group_vars/all.yml").read_text())["flashfleet_runs"]
        assert entries.run_problems(list(runs), runs) == []
    assert problems("v2", GOOD) == [] and problems("v2", None) == [] and problems("v2", {}) == []


@pytest.mark.parametrize("entry, field, needle", [
    # The user's report: a field that must be a mapping, given as a list (a traceback-like spec dump on the host).
    ({"trainer": [{"target_gpus": "0"}]}, "trainer", "must be a mapping, not a list"),
    ({"vllm": [{"port": 8100}]}, "vllm", "must be a mapping, not a list"),
    ({"hosts": {"ct200": None}}, "hosts", "must be a non-empty list of inventory host names, not a mapping"),
    ({"group": ["gpu_nodes"]}, "group", "must be a non-empty string, not a list"),
    # Two servers of a run on one host sharing a GPU, or a port.
    ({"vllm": {"servers": [{"port": 8100, "gpus": "0,1"}, {"port": 8101, "gpus": "1"}]}}, "vllm.servers[1].gpus",
     "shares GPU(s) 1 with flashfleet_runs.r.vllm.servers[0]"),
    ({"vllm": {"servers": [{"port": 8100, "gpus": "0"}, {"port": 8100, "gpus": "1"}]}}, "vllm.servers[1].port",
     "port 8100 is also flashfleet_runs.r.vllm.servers[0]'s"),
    ({"rdzv_port": 8100, "vllm": {"servers": [{"port": 8100}]}}, "vllm.servers[0].port", "is also rdzv_port's"),
    ({"vllm": {"servers": [{"port": 70000}]}}, "vllm.servers[0].port", "must be a TCP port from 1024 to 65535"),
    ({"vllm": {"servers": [{"port": 8100, "gpu": "0"}]}}, "vllm.servers[0]", "unknown field(s) gpu"),
    ({"vllm": {"args": {}}}, "vllm", "needs servers"),
    ({"resources": {"oom_policy": "panic"}}, "resources.oom_policy", "must be one of stop, kill, continue"),
    ({"trainr": {}}, "", "has unknown field(s) trainr"),
])
def test_a_malformed_field_is_refused_naming_the_run_the_field_and_the_fix(entry, field, needle):
    found = problems("r", entry)
    _refused(found, "r", field)
    assert any(needle in m for m in found), found


@pytest.mark.parametrize("name", ["a/b", "-v2", "v2 run", "v2@x", "ü", "", "x" * 240])
def test_a_run_name_systemd_cannot_take_as_an_instance_is_refused(name):
    found = problems(name, {})
    assert len(found) == 1 and "run name" in found[0] and "rename the run" in found[0], found


def test_flashfleet_runs_itself_malformed_is_one_message():
    assert entries.run_problems(["v2"], ["v2"])[0].startswith("flashfleet_runs must be a mapping")
    assert "quote it" in entries.run_problems([], {2024: {}})[0]


@FAST
@given(name=names, entry=st.dictionaries(st.sampled_from(list(entries.FIELDS) + ["x"]), values, max_size=4)
       | values)
def test_any_entry_gives_messages_never_an_exception(name, entry):
    found = problems(name, entry)
    assert isinstance(found, list) and all(isinstance(m, str) and m.startswith(f"run {name}: ") for m in found)


@FAST
@given(data=st.data(), name=names, field=st.sampled_from(sorted(entries.FIELDS)))
def test_a_wrong_type_at_any_field_is_refused(data, name, field):
    value = data.draw(_wrong(entries.FIELDS[field][0]))
    _refused(problems(name, {**GOOD, field: value}), name, field)


@FAST
@given(data=st.data(), name=names, field=st.sampled_from(sorted(entries.SUBFIELDS)))
def test_a_wrong_type_at_any_subfield_is_refused(data, name, field):
    sub = data.draw(st.sampled_from(sorted(entries.SUBFIELDS[field])))
    value = data.draw(_wrong(entries.SUBFIELDS[field][sub][0]))
    _refused(problems(name, {**GOOD, field: {**GOOD.get(field, {}), sub: value}}), name, f"{field}.{sub}")


@FAST
@given(name=st.text(max_size=30).filter(lambda n: not entries.layout.RUN_NAME_RE.match(n)))
def test_any_bad_name_is_refused(name):
    found = problems(name, GOOD)
    assert len(found) == 1 and "cannot be a systemd unit instance" in found[0], found


@FAST
@given(a=st.sets(st.integers(0, 15), min_size=1), b=st.sets(st.integers(0, 15), min_size=1),
       shared=st.integers(0, 15))
def test_servers_sharing_any_gpu_are_refused(a, b, shared):
    servers = [{"port": 8100, "gpus": ",".join(map(str, sorted(a | {shared})))},
               {"port": 8101, "gpus": ",".join(map(str, sorted(b | {shared})))}]
    found = problems("r", {"vllm": {"servers": servers}})
    assert len(found) == 1 and f"shares GPU(s) {', '.join(map(str, sorted((a & b) | {shared})))}" in found[0], found


@FAST
@given(port=st.integers().filter(lambda p: p not in entries.PORTS), where=st.sampled_from(["server", "rdzv"]))
def test_an_out_of_range_port_is_refused(port, where):
    entry = {"rdzv_port": port} if where == "rdzv" else {"vllm": {"servers": [{"port": port, "gpus": "0"}]}}
    _refused(problems("r", entry), "r", "rdzv_port" if where == "rdzv" else "vllm.servers[0].port")


# ---------------------------------------------------------------- flashfleet-classify RUNS_DIR

HANDBUILT = ROOT / "tests/fixtures/evidence/handbuilt"


def _doc(name, host=None):
    """A hand-built evidence document, as gathered on `host` (where given)."""
    doc = json.loads((HANDBUILT / f"{name}.json").read_text())
    return {**doc, "host": host} if host else doc


def _run_dir(root, docs: dict) -> Path:
    """runs/v2/<host>/evidence.json for each host: a document, or the file's raw bytes."""
    for host, doc in docs.items():
        (root / "v2" / host).mkdir(parents=True, exist_ok=True)
        (root / "v2" / host / "evidence.json").write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return root / "v2"


def _classify(run_dir, *flags) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = fc.main([*flags, str(run_dir)])
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("bad, why", [(b"", "cannot read evidence: Expecting value"),
                                      (b"not json\n", "cannot read evidence: Expecting value"),
                                      (json.dumps(_doc("crash")).encode()[:500], "cannot read evidence"),
                                      (b"\xff\xfe", "cannot read evidence: 'utf-8' codec can't decode"),
                                      (b"[1, 2]", "not evidence: a JSON list, not an object")])
def test_one_unreadable_evidence_file_does_not_hide_the_other_hosts(tmp_path, bad, why):
    run = _run_dir(tmp_path, {"gpu01": _doc("crash", "gpu01"), "gpu02": bad, "gpu03": _doc("completed", "gpu03")})
    rc, out, err = _classify(run)
    assert rc == 1
    bad_file = run / "gpu02" / "evidence.json"
    (line,) = err.splitlines()
    assert line.startswith(f"{bad_file}: {why}") and "fix:" in line, line
    rows = {r.split()[0]: r.split()[1] for r in out.split("\n\n")[0].splitlines()[1:]}
    assert rows == {"gpu01": fc.classify(_doc("crash"))["verdict"], "gpu02": "no-evidence",
                    "gpu03": fc.classify(_doc("completed"))["verdict"]}
    assert f"[gpu02] no-evidence: {line}" in out


def test_the_console_script_on_an_empty_file_gives_rows_and_no_traceback(tmp_path):
    run = _run_dir(tmp_path, {"gpu01": _doc("crash", "gpu01"), "gpu02": b""})
    r = subprocess.run([sys.executable, "-m", "flashfleet.classify", "--json", str(run)], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "module_utils")}, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["host"], x["verdict"]) for x in rows] == [("gpu01", fc.classify(_doc("crash"))["verdict"]),
                                                        ("gpu02", "no-evidence")]
    assert rows[1]["action"] == "check-host" and str(run / "gpu02" / "evidence.json") in rows[1]["reason"]


def test_a_classifier_crash_is_the_hosts_row_naming_the_reader(tmp_path, monkeypatch):
    def broken(evidence):
        return {}["no such key"] if evidence.get("host") == "gpu02" else fc.classify(evidence)

    monkeypatch.setattr(cli, "classify", broken)
    rc, out, err = _classify(_run_dir(tmp_path, {"gpu01": _doc("completed", "gpu01"), "gpu02": _doc("crash", "gpu02")}))
    assert rc == 1 and "the classifier failed on this evidence" in err and "KeyError" in err
    assert "[gpu01] completed" in out and "[gpu02] no-evidence" in out


@pytest.mark.parametrize("path, value, says", [
    # Each crashed a reader before the shape check named it (journal.parse_systemd_time, journal.field,
    # rules.not_restarted, rules.disk_full, disk.nearly_full, rules.free, verdict.death_rows, gpu.gpu_findings).
    (("unit_props", "properties", "ExecMainExitTimestamp"), 1, "unit_props.properties.ExecMainExitTimestamp is a number, not a string"),
    (("unit_props", "properties", "Restart"), ["no"], "unit_props.properties.Restart is a list, not a string"),
    (("journal", "entries", 0), None, "journal.entries[0] is null, not an object"),
    (("disk", "output_dir"), 1, "disk.output_dir is a number, not an object"),
    (("disk", "output_dir", "free_bytes"), "1", "disk.output_dir.free_bytes is a string, not a number"),
    (("deaths",), {"records": [1]}, "deaths.records[0] is a number, not an object"),
    (("gpu",), {"gpus": ["x"]}, "gpu.gpus[0] is a string, not an object"),
])
def test_a_value_a_reader_cannot_take_is_named_before_classify(tmp_path, path, value, says):
    rc, out, err = _classify(_run_dir(tmp_path, {"gpu01": _corrupt(_doc("disk-full", "gpu01"), path, value)}))
    assert rc == 1 and err.startswith(f"{tmp_path / 'v2' / 'gpu01' / 'evidence.json'}: not evidence: {says} (fix: "), err


def _paths(node, at=()):
    """Every key path of a document (lists: their first items)."""
    items = node.items() if isinstance(node, dict) else enumerate(node[:1]) if isinstance(node, list) else []
    for k, v in items:
        yield at + (k,)
        yield from _paths(v, at + (k,))


def _corrupt(doc, path, value):
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


EVIDENCE_DOCS = sorted(p.stem for p in HANDBUILT.glob("*.json"))


@settings(max_examples=examples(7.5), suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(EVIDENCE_DOCS))
def test_a_corrupt_value_at_any_evidence_key_gives_a_verdict_never_a_traceback(data, name):
    doc = _doc(name)
    path = data.draw(st.sampled_from(sorted(_paths(doc), key=str)))
    doc = _corrupt(doc, path, data.draw(values))
    with tempfile.TemporaryDirectory() as tmp:
        rc, out, err = _classify(_run_dir(Path(tmp), {"bad": doc, "good": _doc("crash", "good")}), "--json")
    bad, good = json.loads(out)  # a row per host, in the order of their directories
    assert good["verdict"] == fc.classify(_doc("crash"))["verdict"] and isinstance(bad["verdict"], str)
    assert (rc == 1) == (bad["verdict"] == "no-evidence") == bool(err) and rc in (0, 1), (rc, err)
    assert "Traceback" not in err
    # A value classify() cannot take (a reader's bug) is the host's row, naming the reader.
    assert bad["verdict"] != "no-evidence" or bad["reason"].startswith(str(Path(tmp) / "v2" / "bad" / "evidence.json"))


# ---------------------------------------------------------------- flashfleet-report RUN_DIR

GOOD_RECORDS = [{"step": 1, "loss": 2.0, "acc": [0.5, 0.3], "accept_proxy": 1.5, "invocation": 1},
                {"step": 2, "loss": 1.5, "acc": [0.6, 0.3], "accept_proxy": 1.6, "invocation": 1}]
METRIC_KEYS = sorted(set(fr.metrics.STEP_KEYS + fr.metrics.EVAL_KEYS) | {fr.metrics.INVOCATION})


def _report_dir(root, metrics_bytes: bytes, status=None, diagnosis=None) -> Path:
    host = root / "v2" / "gpu01"
    host.mkdir(parents=True, exist_ok=True)
    (host / "metrics.jsonl").write_bytes(metrics_bytes)
    for name, doc in (("status.json", status), ("diagnosis.json", diagnosis)):
        if doc is not None:
            (host / name).write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return root / "v2"


def _jsonl(records) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def _report(run_dir) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = fr.main([str(run_dir)])
    return rc, err.getvalue()


@pytest.mark.parametrize("status, says", [(b"", "not JSON"), (b'{"phase": "train', "not JSON"),
                                          ([1], "not a JSON object"), ({"phase": 3}, "unknown phase 3")])
def test_a_damaged_status_file_is_named_and_the_report_still_written(tmp_path, status, says):
    run = _report_dir(tmp_path, _jsonl(GOOD_RECORDS), status=status)
    with mock.patch.object(fr, "plots", lambda hosts: []):
        rc, err = _report(run)
    (line,) = err.splitlines()
    assert rc == 0 and line.startswith(f"warning: {run / 'gpu01' / 'status.json'}: {says}") and "(fix: " in line
    assert "<td>gpu01</td>" in (run / "report.html").read_text()


@pytest.mark.parametrize("records, diagnosis", [
    ([{**GOOD_RECORDS[0], "step": {}}, {**GOOD_RECORDS[1], "step": [[1]]}], None),  # plots: float() of a dict
    ([{**GOOD_RECORDS[0], "loss": 10**400, "peak_mem_bytes": 10**400}], None),  # int too large for a float
    ([{**r, "loss": 1e308} for r in GOOD_RECORDS], None),  # matplotlib's ticks overflow
    (GOOD_RECORDS, {"verdict": None, "reason": True, "newest_checkpoint": ["x"]}),  # html.escape of None
])
def test_values_of_the_wrong_type_give_a_report_not_a_traceback(tmp_path, records, diagnosis):
    pytest.importorskip("matplotlib")
    rc, err = _report(_report_dir(tmp_path, _jsonl(records), diagnosis=diagnosis))
    assert rc == 0 and err == ""
    assert "<td>gpu01</td>" in (tmp_path / "v2" / "report.html").read_text()


records = st.lists(st.dictionaries(st.sampled_from(METRIC_KEYS), values, max_size=4)
                   .map(lambda r: {**GOOD_RECORDS[0], **r}), max_size=4)
raw_lines = st.lists(st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"") + b"\n"), max_size=2)
status_docs = st.none() | st.binary(max_size=20) | st.dictionaries(
    st.sampled_from(["phase", "step", "epoch", "newest_checkpoint", "pid"]), values, max_size=3) | values
diagnosis_docs = st.none() | st.dictionaries(st.sampled_from(["verdict", "reason", "newest_checkpoint"]), values,
                                             max_size=3) | values


def _report_never_raises(recs, raw, status, diagnosis, plot):
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(fr, "plots", fr.plots if plot else lambda h: []):
        run = _report_dir(Path(tmp), _jsonl(recs) + b"".join(raw), status=status, diagnosis=diagnosis)
        rc, err = _report(run)
        assert rc in (0, 2) and "Traceback" not in err
        assert (rc == 0) == (run / "report.html").exists()
        # every stderr line is a warning naming a file, or the one refusal of the directory
        assert all(line.startswith("warning: ") or "not a run directory" in line for line in err.splitlines()), err


@settings(max_examples=examples(7.5), suppress_health_check=[HealthCheck.too_slow])
@given(recs=records, raw=raw_lines, status=status_docs, diagnosis=diagnosis_docs)
def test_generated_damage_gives_a_report_or_one_refusal(recs, raw, status, diagnosis):
    _report_never_raises(recs, raw, status, diagnosis, plot=False)


@settings(max_examples=examples(0.25), suppress_health_check=[HealthCheck.too_slow])
@given(recs=records.filter(bool), raw=raw_lines, status=status_docs, diagnosis=diagnosis_docs)
def test_generated_damage_is_plotted_without_a_traceback(recs, raw, status, diagnosis):
    pytest.importorskip("matplotlib")
    _report_never_raises(recs, raw, status, diagnosis, plot=True)

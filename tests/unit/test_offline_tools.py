"""The offline tools on damaged input: flashfleet-report on a metrics.jsonl that is not UTF-8
(decision: the report is written, the skipped lines named on stderr and in the report, exit 0;
a directory with nothing readable is refused, naming the file), and flashfleet-classify on an
evidence.json whose fields have the wrong JSON type (one line naming the file, the field and the
fix, a no-evidence row for its host, exit 1, never a traceback), while every real evidence document
still passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import flashfleet.classify as fc
import flashfleet.evidence as fe
import flashfleet.report as fr
import pytest

from tests.conftest import ROOT

EVIDENCE = ROOT / "tests" / "fixtures" / "evidence" / "recorded"


def _lines(*recs) -> bytes:
    return b"".join(r if isinstance(r, bytes) else json.dumps(r).encode() + b"\n" for r in recs)


# ---------------------------------------------------------------- flashfleet-report


def test_report_on_a_non_utf8_metrics_file_names_it_and_keeps_the_good_records(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = tmp_path / "v2"
    (run / "gpu01").mkdir(parents=True)
    metrics = run / "gpu01" / "metrics.jsonl"
    metrics.write_bytes(_lines({"step": 1, "loss": 2.0}, b"\xff\xfe\x00garbage\n", {"step": 2, "loss": 1.5},
                               b"[1, 2]\n"))
    assert fr.main([str(run)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"warning: {metrics}: skipped 2 line(s)")
    assert "line 2: not UTF-8" in err[0] and "line 4: a JSON list, not an object" in err[0] and "(fix: " in err[0]
    html = (run / "report.html").read_text()
    assert '<ul id="warnings">' in html and "line 2: not UTF-8" in html
    assert "<td>gpu01</td>" in html and "<td>2</td>" in html  # both good records counted


def test_report_on_a_clean_run_has_no_warnings(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    (tmp_path / "v2" / "gpu01").mkdir(parents=True)
    (tmp_path / "v2" / "gpu01" / "metrics.jsonl").write_bytes(_lines({"step": 1, "loss": 2.0}))
    assert fr.main([str(tmp_path / "v2")]) == 0
    assert capsys.readouterr().err == ""
    assert "warnings" not in (tmp_path / "v2" / "report.html").read_text()


def test_report_refuses_a_run_whose_only_metrics_are_unreadable_naming_the_file(tmp_path, capsys):
    run = tmp_path / "v2"
    (run / "gpu01").mkdir(parents=True)
    bad = run / "gpu01" / "metrics.jsonl"
    bad.write_bytes('{"step": 1, "loss": 2.0, "note": "café"}\n'.encode("latin-1"))  # Latin-1, not UTF-8
    assert fr.main([str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"warning: {bad}: skipped 1 line(s)") and "not UTF-8" in err[0]
    assert "not a run directory" in err[1] and "fix:" in err[1]
    assert not (run / "report.html").exists()


# ---------------------------------------------------------------- flashfleet-classify


def _evidence_file(tmp_path, evidence) -> Path:
    path = tmp_path / "v2" / "gpu01" / "evidence.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(evidence))
    return path


def _good():
    return json.loads((EVIDENCE / "completed-short.json").read_text())


@pytest.mark.parametrize("field, value, says", [
    ("journal", "not an object", "journal is a string, not an object"),
    ("journal.entries", {"MESSAGE": "x"}, "journal.entries is an object, not a list"),
    ("journal.entries[0]", "a bare line", "journal.entries[0] is a string, not an object"),
    ("unit_props.properties", ["ActiveState=failed"], "unit_props.properties is a list, not an object"),
    ("status.data", [1, 2], "status.data is a list, not an object"),
    ("checkpoints.newest", "step-00000100", "checkpoints.newest is a string, not an object"),
    ("metrics.last", 7, "metrics.last is a number, not an object"),
    ("run", 42, "run is a number, not a string"),
    ("venv.drift", True, "venv.drift is a boolean, not a list"),
])
def test_classify_refuses_a_field_of_the_wrong_type_in_one_line(tmp_path, capsys, field, value, says):
    ev = _good()
    node, keys = ev, field.replace("[0]", ".0").split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    if keys[-1] == "0":
        node.insert(0, value)
    else:
        node[keys[-1]] = value
    path = _evidence_file(tmp_path, ev)
    assert fc.main([str(path)]) == 1
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()
    assert line.startswith(f"{path}: not evidence: {says} (fix: collect it again with diagnose.yml")
    assert f"[gpu01] no-evidence: {line}" in out.out  # the host is still a row of the table


def test_classify_console_script_gives_no_traceback(tmp_path):
    path = _evidence_file(tmp_path, {"journal": {"entries": "oops"}})
    r = subprocess.run([sys.executable, "-m", "flashfleet.classify", str(path)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "module_utils")}, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (f"{path}: not evidence: journal.entries is a string, not a list (fix: collect it "
                                "again with diagnose.yml or collect.yml; an edited file must keep the shape "
                                "flashfleet_evidence writes)")


def test_every_recorded_evidence_document_has_the_shape(tmp_path):
    files = sorted(EVIDENCE.glob("*.json"))
    assert files
    for f in files:
        assert fc.shape_problem(json.loads(f.read_text())) is None, f


def test_a_freshly_gathered_document_has_the_shape(tmp_path):
    """The producer and the check agree: gather() on this machine (no unit, no GPU: every part
    recorded as absent or unreadable) passes, and the classifier takes it."""
    ev = fe.gather({"run": "v2", "output_dir": str(tmp_path / "out"), "config_dir": str(tmp_path / "cfg"),
                    "venv": str(tmp_path / "venv"), "lock": str(tmp_path / "x.lock"), "command_timeout": 2.0})
    assert fc.shape_problem(ev) is None
    path = _evidence_file(tmp_path, ev)
    assert fc.main([str(path)]) == 0

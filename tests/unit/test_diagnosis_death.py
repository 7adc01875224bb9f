"""Word at death (flashfleet.death, run by flashfleet-verdict@<run>.service): a death is recorded
once, whole, never overwritten; diagnose reads the records; the verdict reaches a real local
webhook with its token, which no record or log line holds; a failed POST keeps the verdict. And
the two unit templates, rendered with the role's defaults, wire it up."""

from __future__ import annotations

import json
import shlex
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import jinja2
import pytest
import yaml
from flashfleet import classify as fc
from flashfleet import death as fd
from flashfleet import evidence as fe
from flashfleet.contract import layout

from tests.host_paths import HOST_PATHS
from tests.unit import test_diagnosis_evidence as recorded

SYSTEMCTL_SHOW = recorded.SYSTEMCTL_SHOW
# The evidence tests' stub host (systemctl/journalctl replaying a SIGKILLed unit), as fixture `host`.
host = recorded.stubbed_host

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-3b9e1f0c77aa"


def _set_show(stub, **props):
    """Rewrite the stub's `systemctl show` output with some properties changed."""
    show = Path(stub["output_dir"]).parent / "show.txt"
    lines = dict(line.split("=", 1) for line in SYSTEMCTL_SHOW.splitlines())
    lines.update(props)
    show.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))


def _records(stub):
    deaths = Path(stub["output_dir"]) / layout.DEATHS
    return sorted(p.name for p in deaths.iterdir()) if deaths.exists() else []


def test_a_death_is_recorded_whole_once(host):
    logs = []
    out = fd.record(host, environ={}, now=1764527102.25, log=logs.append)
    rec = Path(out["recorded"])
    assert rec.parent == Path(host["output_dir"]) / layout.DEATHS
    assert rec.name == "20251130T182502.250000Z-6c1e0d6b2f0a"
    assert sorted(p.name for p in rec.iterdir()) == [layout.DEATH_EVIDENCE, layout.DEATH_VERDICT]
    verdict = json.loads((rec / layout.DEATH_VERDICT).read_text())
    assert verdict["verdict"] == "killed-by-signal"
    assert verdict["death"]["invocation_id"] == "6c1e0d6b2f0a4d5c9e8f7a6b5c4d3e21"
    assert verdict["death"]["result"] == "signal" and verdict["death"]["webhook"] is None
    assert json.loads((rec / layout.DEATH_EVIDENCE).read_text())["unit"] == "flashfleet-train@v2.service"
    assert logs[0].startswith("flashfleet-train@v2.service died: killed-by-signal (action ")

    # OnFailure= after ExecStopPost= sees the same death: not recorded again.
    again = fd.record(host, environ={}, now=1764527103.0, log=logs.append)
    assert again["recorded"] is None and "already recorded in " + rec.name in again["skipped"]
    assert _records(host) == [rec.name]

    # The start limit hit after it is a death of its own (same invocation, another result).
    _set_show(host, Result="start-limit-hit")
    third = fd.record(host, environ={}, now=1764527104.0, log=logs.append)
    assert json.loads(Path(third["recorded"], layout.DEATH_VERDICT).read_text())["verdict"] == "start-limit-hit"
    assert len(_records(host)) == 2


def test_the_start_limit_is_a_death_of_its_own_when_systemd_keeps_the_result(host):
    """systemd 252 (Debian 12): the refused restart leaves Result=exit-code; the journal's 'Start
    request repeated too quickly' makes it start-limit-hit, recorded beside the death before it."""
    _set_show(host, Result="exit-code", ExecMainCode="1", ExecMainStatus="3")
    first = fd.record(host, environ={}, now=1764527102.0, log=lambda line: None)
    assert json.loads(Path(first["recorded"], layout.DEATH_VERDICT).read_text())["verdict"] != "start-limit-hit"
    journal = Path(host["output_dir"]).parent / "journal.json"
    inv = "6c1e0d6b2f0a4d5c9e8f7a6b5c4d3e21"
    journal.write_text(journal.read_text() + "\n" + "\n".join(json.dumps(e) for e in [
        {"__REALTIME_TIMESTAMP": "1764527102000000", "_PID": "1", "UNIT": "flashfleet-train@v2.service",
         "INVOCATION_ID": inv, "MESSAGE": "flashfleet-train@v2.service: Start request repeated too quickly."},
        {"__REALTIME_TIMESTAMP": "1764527102000100", "_PID": "1", "UNIT": "flashfleet-train@v2.service",
         "INVOCATION_ID": inv, "MESSAGE": "flashfleet-train@v2.service: Failed with result 'exit-code'."}]) + "\n")
    second = fd.record(host, environ={}, now=1764527103.0, log=lambda line: None)
    assert second["recorded"], second["skipped"]
    assert json.loads(Path(second["recorded"], layout.DEATH_VERDICT).read_text())["verdict"] == "start-limit-hit"
    assert fd.record(host, environ={}, now=1764527104.0, log=lambda line: None)["skipped"]
    assert len(_records(host)) == 2


def test_nothing_is_recorded_while_the_unit_is_fine(host):
    _set_show(host, Result="success", ActiveState="active", SubState="running")
    out = fd.record(host, environ={}, log=lambda line: None)
    assert out["recorded"] is None and out["skipped"].startswith("nothing died")
    assert _records(host) == []


def test_a_record_is_never_overwritten(tmp_path):
    first = fd.write_record(str(tmp_path), "20261201T000000.000000Z-abc", {"e": 1}, {"v": 1})
    second = fd.write_record(str(tmp_path), "20261201T000000.000000Z-abc", {"e": 2}, {"v": 2})
    assert first != second
    assert json.loads(Path(first, layout.DEATH_VERDICT).read_text()) == {"v": 1}
    assert json.loads(Path(second, layout.DEATH_VERDICT).read_text()) == {"v": 2}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_diagnose_reads_the_records(host):
    fd.record(host, environ={}, now=1764527102.0, log=lambda line: None)
    # The unit restarted and trains again; the journal no longer holds the death.
    _set_show(host, Result="success", ActiveState="active", SubState="running", NRestarts="1",
              InvocationID="00000000000000000000000000000002")
    Path(host["output_dir"]).parent.joinpath("journal.json").write_text("")
    ev = fe.gather(host)
    assert ev["deaths"]["count"] == 1 and ev["deaths"]["records"][0]["verdict"]["verdict"] == "killed-by-signal"
    assert ev["deaths"]["records"][0]["files"] == [layout.DEATH_EVIDENCE, layout.DEATH_VERDICT]
    d = fc.classify(ev)
    assert d["verdict"] == "running"
    assert [r["verdict"] for r in d["deaths"]] == ["killed-by-signal"]
    assert d["previous"]["verdict"] == "killed-by-signal" and d["previous"]["record"] == d["deaths"][0]["record"]
    assert "last recorded death" in d["reason"]


def test_deaths_state_keeps_the_newest_and_skips_unfinished(tmp_path):
    for i in range(5):
        fd.write_record(str(tmp_path), f"2026120{i}T000000.000000Z-x", {}, {"verdict": "crash"})
    (tmp_path / ".20261209T000000.000000Z-x.tmp").mkdir()
    state = fe.deaths_state(str(tmp_path), keep=3)
    assert state["count"] == 5 and state["truncated"]
    assert [r["name"][:9] for r in state["records"]] == ["20261202T", "20261203T", "20261204T"]
    assert fe.deaths_state(str(tmp_path / "none"))["records"] == []


class _Sink(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append({"path": self.path, "headers": dict(self.headers.items()), "body": json.loads(body)})
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def sink():
    _Sink.received = []
    server = HTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_the_verdict_reaches_the_webhook_with_its_token(host, sink):
    logs = []
    env = {layout.WEBHOOK_URL_ENV: f"http://127.0.0.1:{sink.server_port}/hooks/flashfleet?key=secret-in-url",
           layout.WEBHOOK_TOKEN_ENV: TOKEN}
    out = fd.record(host, environ=env, log=logs.append)
    (post,) = _Sink.received
    assert post["path"] == "/hooks/flashfleet?key=secret-in-url"
    assert post["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert post["headers"]["Content-Type"] == "application/json"
    assert post["body"]["verdict"] == "killed-by-signal" and post["body"]["run"] == "v2"
    assert post["body"]["death"]["record"] == Path(out["recorded"]).name
    hook = json.loads(Path(out["recorded"], layout.DEATH_WEBHOOK).read_text())
    assert hook["ok"] is True and hook["status"] == 204 and hook["url"] == f"http://127.0.0.1:{sink.server_port}"
    # Neither the token nor the URL's path and query are in a record or a log line.
    written = "\n".join(logs) + "".join(p.read_text() for p in Path(out["recorded"]).iterdir())
    assert TOKEN not in written and "secret-in-url" not in written


def test_a_failed_post_is_logged_and_keeps_the_verdict(host, sink):
    port = sink.server_port
    sink.shutdown()
    sink.server_close()  # nothing listens there any more
    logs = []
    out = fd.record(host, environ={layout.WEBHOOK_URL_ENV: f"http://127.0.0.1:{port}/x",
                                           layout.WEBHOOK_TIMEOUT_ENV: "2"}, log=logs.append)
    rec = Path(out["recorded"])
    assert json.loads((rec / layout.DEATH_VERDICT).read_text())["verdict"] == "killed-by-signal"
    hook = json.loads((rec / layout.DEATH_WEBHOOK).read_text())
    assert hook["ok"] is False and hook["error"]
    assert any(line.startswith(f"webhook http://127.0.0.1:{port}: failed: ") for line in logs)


def test_a_bad_webhook_setting_loses_only_the_post(host):
    logs = []
    out = fd.record(host, environ={layout.WEBHOOK_URL_ENV: "file:///etc/shadow"}, log=logs.append)
    assert out["recorded"] and out["webhook"] is None
    assert any("webhook not used" in line and "not http(s)" in line for line in logs)


def test_main_refuses_a_missing_run_directory(tmp_path, capsys):
    rc = fd.main(["--run", "v2", "--output-dir", str(tmp_path / "nope"), "--config-dir", str(tmp_path),
                  "--venv", str(tmp_path), "--lock", str(tmp_path / "l")])
    assert rc == 2 and "no such run directory" in capsys.readouterr().err


# ---- the unit templates, rendered with the role's defaults -------------------------------------


def _render(name):
    defaults = yaml.safe_load((ROOT / "roles/train_unit/defaults/main.yml").read_text())
    contract = yaml.safe_load((ROOT / "roles/flashfleet_contract/defaults/main.yml").read_text())
    # Variables of the role's vars/main.yml (set at play time) render empty: the lines asserted
    # on use only defaults and the contract.
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined, keep_trailing_newline=True)
    env.filters["flashfleet_contract"] = lambda n: getattr(__import__(f"flashfleet.contract.{n.split('.')[0]}",
                                                                      fromlist=["x"]), n.split(".")[1])
    values = {**contract, "ansible_managed": "managed", "train_unit_exit_config": 78, "train_unit_exit_nonfinite": 65}
    # The role's defaults point at the contract's paths ("{{ flashfleet_venv }}"): resolve them once.
    for key, value in defaults.items():
        values[key] = env.from_string(value).render(values) if isinstance(value, str) else value
    return env.from_string((ROOT / "roles/train_unit/templates" / name).read_text()).render(values)


def _directives(text):
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_the_trainer_unit_starts_the_verdict_unit_on_every_failure():
    train = _directives(_render("flashfleet-train@.service.j2"))
    verdict_unit = layout.VERDICT_UNIT_TEMPLATE.replace("@", "@%i")
    assert train["OnFailure"] == [verdict_unit]
    (stop_post,) = train["ExecStopPost"]
    # root (+), its failure ignored (-); $$ is systemd's literal $ for the shell.
    assert stop_post.startswith("-+/bin/sh -c ")
    script = shlex.split(stop_post[2:])[2]
    assert script == f'[ "$$SERVICE_RESULT" = success ] || exec systemctl start {verdict_unit}'


def test_the_verdict_unit_runs_the_recorder_without_the_secret_on_its_command_line():
    unit = _directives(_render(layout.VERDICT_UNIT_TEMPLATE + ".j2"))
    assert unit["Type"] == ["oneshot"]
    argv = shlex.split(unit["ExecStart"][0].replace("%i", "v2"))
    venv, runs, config = (HOST_PATHS[k] for k in ("flashfleet_venv", "flashfleet_runs_root", "flashfleet_config_root"))
    assert argv[:3] == [f"{venv}/bin/python", "-m", "flashfleet.death"]
    args = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert args == {"--run": "v2", "--output-dir": f"{runs}/v2", "--config-dir": config,
                    "--venv": venv, "--lock": f"{venv}/flashfleet.lock"}
    # The webhook comes from the root-only file train_unit writes (vars/main.yml), never the command line.
    vars_text = (ROOT / "roles/train_unit/vars/main.yml").read_text()
    assert 'train_unit_webhook_env_file: "{{ train_unit_config_dir }}/{{ train_unit_run }}.webhook.env"' in vars_text
    assert unit["EnvironmentFile"] == [f"-{config}/%i.webhook.env"]
    assert "WEBHOOK" not in unit["ExecStart"][0] and "Environment" not in unit
    assert unit["ReadWritePaths"] == [f"-{runs}/%i"]
    # The recorder's own parser takes that command line.
    parsed = fd.parser().parse_args(argv[3:])
    assert (parsed.run, parsed.output_dir, parsed.unit) == ("v2", f"{runs}/v2", None)

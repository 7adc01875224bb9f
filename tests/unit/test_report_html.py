"""report.html from a synthetic run directory: table, every plot, PNGs embedded and valid."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import flashfleet.report as fr
import pytest
from flashfleet.contract import metrics

pytest.importorskip("matplotlib")


def _metrics(n: int, t0: float = 1_764_525_600.0) -> str:
    lines = []
    for step in range(1, n + 1):
        lines.append(json.dumps({
            "step": step, "epoch": step // 50, "time": t0 + 2 * step, "loss": 3.0 / (1 + step / 20),
            "ce": 2.0 / (1 + step / 20), "kl": 1.0 / (1 + step / 20), "lr": 6e-4 * min(1, step / 10),
            "noise": 0.1 - 0.09 * step / n, "acc": [0.9 - 0.05 * i for i in range(16)],
            "accept_proxy": 1 + 3 * step / n, "target_tokens_per_s": 50000.0 + step,
            "drafter_rows_per_s": 120.0, "peak_mem_bytes": 3 * 2**30}))
    lines.append(json.dumps({"step": n, "tau": 4.12, "tau_pooled": 4.12, "tau_prompt_mean": 3.9,
                             "accept_rate": [0.9, 0.7, None]}))
    return "\n".join(lines) + "\n" + '{"step": 10'  # a line cut by a crash


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "v2"
    (run / "gpu01").mkdir(parents=True)
    (run / "gpu01" / "metrics.jsonl").write_text(_metrics(120))
    (run / "gpu01" / "status.json").write_text(json.dumps({"phase": "completed", "step": 120, "epoch": 2}))
    (run / "gpu01" / "diagnosis.json").write_text(json.dumps(
        {"verdict": "completed", "reason": "finished <ok>", "newest_checkpoint": "step-00000120"}))
    (run / "gpu02").mkdir()
    (run / "gpu02" / "diagnosis.json").write_text(json.dumps({"verdict": "init-crash", "reason": "ValidationError"}))
    return run


def test_report_has_table_and_all_plots(run_dir):
    out = fr.write_report(run_dir)
    text = out.read_text()
    assert out == run_dir / "report.html"
    assert "gpu01" in text and "gpu02" in text and "init-crash" in text
    assert "finished &lt;ok&gt;" in text, "cells are escaped"
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    titles = re.findall(r"<figcaption>([^<]+)</figcaption>", text)
    assert titles == ["Loss and its parts", "Learning rate", "Noise scale", "Acceptance", "Throughput",
                      "Peak memory", "Accuracy by block position", "Acceptance by draft position"]
    assert len(images) == len(titles)
    for b64 in images:
        png = base64.b64decode(b64)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    assert "4.12" in text  # tau in the summary
    assert "http" not in text.replace("http-equiv", ""), "no external resources"


def test_report_without_metrics_and_cli(run_dir, tmp_path):
    (run_dir / "gpu01" / "metrics.jsonl").unlink()
    res = subprocess.run([sys.executable, "-m", "flashfleet.report", str(run_dir), "-o", str(tmp_path / "r.html")],
                         capture_output=True, text=True, check=True)
    assert res.stdout.strip() == str(tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    assert "No metrics records yet." in text and "<img" not in text


def test_summary_row_shows_the_last_steps_loss_not_the_final_tau_record(run_dir):
    hosts = fr.load_run(run_dir)
    row = dict(zip(fr.HEAD, fr.summary_rows(hosts)[0], strict=True))
    assert row["tau"] == "4.12" and row["loss"] != "-"


def test_tau_is_shown_with_what_it_was_measured_with(run_dir):
    """The summary's tau comes with the newest evaluation's sampling settings and thinking switch
    (contract.metrics.settings_label); a record from before those keys shows as far as it goes."""
    path = run_dir / "gpu01" / "metrics.jsonl"
    with path.open("a") as f:
        f.write("\n" + json.dumps({"step": 121, "tau": 2.5, "tau_pooled": 2.5, "temperature": 1.0, "top_p": 0.95,
                                   "top_k": 20, "thinking": "off"}) + "\n")
    row = dict(zip(fr.HEAD, fr.summary_rows(fr.load_run(run_dir))[0], strict=True))
    assert (row["tau"], row["tau measured with"]) == ("2.5", "T 1, top-p 0.95, top-k 20, thinking off")
    assert "T 1, top-p 0.95, top-k 20, thinking off" in fr.write_report(run_dir).read_text()
    assert metrics.settings_label({"temperature": 0.0, "top_p": 1.0, "top_k": 0, "thinking": "on"}) == "greedy, thinking on"
    assert metrics.settings_label({"temperature": 0.0, "top_p": 1.0}) == "greedy"  # an older record
    assert metrics.settings_label({"temperature": 1.0, "draft_sample_method": "greedy"}) == "T 1, greedy drafts"
    assert metrics.settings_label({"temperature": 0.0, "draft_sample_method": "greedy"}) == "greedy"
    assert metrics.settings_label({"tau": 4.12}) == "?"
    check = {"host": "gpu01", "vllm": {"tau": 4.0}, "dflash_eval": {"tau": 4.1, "temperature": 0.0, "top_p": 1.0,
                                                                   "top_k": 0, "thinking": None}}
    assert "new tokens, greedy)" in "".join(fr.serve_check_part(check))


def test_console_script_writes_the_report(run_dir):
    """`flashfleet-report RUN_DIR` (pyproject's console script) is the same entry point."""
    script = Path(sys.executable).with_name("flashfleet-report")
    if not script.exists():
        pytest.skip("the project is not installed with its console scripts in this venv")
    res = subprocess.run([str(script), str(run_dir)], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == str(run_dir / "report.html") and (run_dir / "report.html").is_file()


def test_every_plotted_key_is_a_metrics_key_of_the_contract():
    plotted = ({key for _title, _y, keys, _log in fr.PLOTS for key, _label in keys}
               | {key for key, _title, _y in fr.BY_POSITION})
    assert plotted - {fr.PEAK_MEM_GIB} <= set(metrics.STEP_KEYS) | set(metrics.EVAL_KEYS)
    assert {metrics.LOSS, metrics.TAU} <= plotted


def test_acceptance_by_position_comes_from_the_newest_evaluation(run_dir):
    # Without an evaluation record that has accept_rate, there is no such plot.
    path = run_dir / "gpu01" / "metrics.jsonl"
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines() if "accept_rate" not in line))
    titles = re.findall(r"<figcaption>([^<]+)</figcaption>", fr.write_report(run_dir).read_text())
    assert "Acceptance by draft position" not in titles and "Accuracy by block position" in titles


def test_a_status_json_that_is_not_a_status_record_is_left_out(run_dir):
    (run_dir / "gpu01" / "status.json").write_text(json.dumps({"phase": "exploded"}))
    hosts = fr.load_run(run_dir)
    assert hosts["gpu01"]["status"] == {} and hosts["gpu01"]["metrics"]
    row = dict(zip(fr.HEAD, fr.summary_rows(hosts)[0], strict=True))
    assert row["phase"] == "-" and row["step"] == "120"  # the step from the newest step record


def test_restarts_are_marked_and_superseded_steps_plotted_once(tmp_path, monkeypatch):
    import matplotlib.axes

    run = tmp_path / "v3"
    (run / "gpu01").mkdir(parents=True)
    rec = lambda step, inv, loss: json.dumps({"step": step, "invocation": inv, "loss": loss, "lr": 1e-4})  # noqa: E731
    # start 1 logged steps 1-5 and died (newest checkpoint 3); start 2 resumed from 3
    lines = [rec(s, 1, 9.0) for s in range(1, 6)] + [rec(s, 2, 1.0) for s in range(4, 8)]
    (run / "gpu01" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    lines_x, vlines = [], []
    real_plot, real_axvline = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.axvline

    def plot(self, xs, ys, *a, **kw):
        lines_x.append((self, list(xs), list(ys)))
        return real_plot(self, xs, ys, *a, **kw)

    def axvline(self, x=0, *a, **kw):
        vlines.append((self, x))
        return real_axvline(self, x, *a, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    monkeypatch.setattr(matplotlib.axes.Axes, "axvline", axvline)
    text = fr.write_report(run).read_text()
    loss = next((xs, ys) for _ax, xs, ys in lines_x if 9.0 in ys or 1.0 in ys)
    assert loss == ([1, 2, 3, 4, 5, 6, 7], [9.0, 9.0, 9.0, 1.0, 1.0, 1.0, 1.0]), "each step once, the newest start's"
    axes = {ax for ax, _x in vlines}
    assert {x for _ax, x in vlines} == {3} and len(axes) == len(re.findall(r"<figcaption>", text)) == 2  # loss, lr
    assert '<table id="restarts">' in text and "<td>gpu01</td><td>2</td><td>3</td>" in text
    assert re.search(r"<td>gpu01</td>(<td[^>]*>[^<]*</td>){11}<td>7</td>", text), "records: the history's"

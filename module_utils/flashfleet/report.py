"""Write runs/<run>/report.html from what collect.yml brought home: one self-contained file.

    flashfleet-report runs/v2                     # -> runs/v2/report.html
    flashfleet-report runs/v2 -o /tmp/r.html      # (or: python -m flashfleet.report ...)

Reads, per host directory: metrics.jsonl (one record per optimizer step; its history: a
restart's records supersede what the dead start logged after the resumed checkpoint, and each
restart is a dotted vertical line on the curves and a row of the restarts table), status.json and
diagnosis.json (any may be missing), with the run contract's readers and names
(`contract.metrics.read`, `contract.status.read`, `contract.layout`). Plots are PNGs (matplotlib,
Agg) embedded as base64, so the file opens in any browser, offline, and can be mailed around.
Needs matplotlib (imported only to plot); nothing else outside the standard library. Runs on the
controller only.

Damaged input: a metrics.jsonl line that is not UTF-8, not JSON or not an object is skipped (as the
contract's reader does: a line cut by a crash is normal in an append-only file), and each such
file is named with its line numbers and the fix, on stderr and in the report; the report is still
written (exit 0). A status.json that is there but not a status record is named the same way and
left out. A value of the wrong type (a string step, a list for a loss, a number too large for a
float) is shown as text in the tables and left out of the plots. A directory where nothing is
readable is refused (exit 2), the files named.
"""

import argparse
import base64
import html
import io
import json
import math
import sys
import time
from pathlib import Path

from .contract import layout, metrics, status

DIAGNOSIS = "diagnosis.json"  # written by run_diagnosis beside the host's copies
SERVE_CHECK = "serve_check.json"  # RUNS_DIR/RUN/, written by run_collect's serve check (collect.yml -e serve_check=true)
PEAK_MEM_GIB = "peak_mem_gib"  # derived here from the record's peak_mem_bytes

# (title, y label, [(metric key, label)], log scale). Every key is a metrics.jsonl key
# (contract.metrics.STEP_KEYS / EVAL_KEYS), except PEAK_MEM_GIB.
PLOTS = (
    ("Loss and its parts", "loss", [(metrics.LOSS, "loss"), ("ce", "CE"), ("kl", "KL")], False),
    ("Learning rate", "lr", [("lr", "lr")], False),
    ("Noise scale", "noise", [("noise", "noise")], False),
    ("Acceptance", "acceptance", [("accept_proxy", "accept proxy"), (metrics.TAU, "tau (pooled)"),
                                  ("tau_prompt_mean", "tau (mean over prompts)")], False),
    ("Throughput", "per second", [("target_tokens_per_s", "target tokens/s"),
                                  ("drafter_rows_per_s", "drafter rows/s")], True),
    ("Peak memory", "GiB", [(PEAK_MEM_GIB, "peak memory")], False),
)
ACC = "acc"  # per block position (a list), plotted from the last record that has it
# Lists by position, each plotted from the newest record that has it: (key, title, y label).
BY_POSITION = (
    (ACC, "Accuracy by block position (last step)", "accuracy"),
    ("accept_rate", "Acceptance by draft position (newest evaluation)", "acceptance rate"),
)


# A value a metric can plot: larger ones are damage, and make matplotlib's tick arithmetic overflow.
PLOTTABLE = 1e100


def number(v) -> float | None:
    """v as a plottable float; None for anything else (a string, a list, a bool, inf, 10**400)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        v = float(v)
    except OverflowError:
        return None
    return v if math.isfinite(v) and abs(v) < PLOTTABLE else None


def read_metrics(path: Path) -> list[dict]:
    """Every record of a host's metrics.jsonl (none when it is missing), with PEAK_MEM_GIB added."""
    try:
        records = metrics.read(path)
    except (OSError, RecursionError):  # RecursionError: a line nested too deep for json
        return []
    for rec in records:
        if number(rec.get("peak_mem_bytes")) is not None:
            rec[PEAK_MEM_GIB] = number(rec["peak_mem_bytes"]) / 2**30
    return records


def damaged_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, why) for each non-empty line of a metrics.jsonl that the contract's reader
    skips: not UTF-8, not JSON, or not a JSON object. None for a missing or unreadable file."""
    try:
        raw = path.read_bytes()
    except OSError:
        return []
    out = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)  # as the contract's reader parses it (bytes: UTF-8, -16 or -32)
        except RecursionError:
            out.append((n, "nested too deep"))
            continue
        except ValueError:  # also UnicodeDecodeError
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                out.append((n, "not UTF-8"))
            else:
                out.append((n, "not JSON"))
            continue
        if not isinstance(rec, dict):
            out.append((n, f"a JSON {type(rec).__name__}, not an object"))
    return out


def metrics_warning(path: Path) -> str | None:
    """One line naming a metrics file whose lines were skipped, and what to do; None if clean.
    Decision: the report is still written (a line cut by a crash is normal in an append-only
    file); the skipped lines are named on stderr and in the report."""
    bad = damaged_lines(path)
    if not bad:
        return None
    where = "; ".join(f"line {n}: {why}" for n, why in bad[:5]) + ("; ..." if len(bad) > 5 else "")
    return (f"{path}: skipped {len(bad)} line(s) that are not metrics records ({where}) (fix: nothing if "
            "it is the last line, cut by a crash; otherwise the file was damaged: collect it again with "
            "collect.yml)")


def _status(path: Path) -> tuple[dict, str | None]:
    """(the host's status record or {}, one line naming a status.json that is there but not a
    status record, else None): the report is still written, without it."""
    try:
        return status.read(path), None
    except status.StatusError as exc:
        why = str(exc) if path.exists() else None
    except RecursionError:  # nested too deep for json
        why = f"{path}: nested too deep"
    return {}, why and f"{why} (fix: collect it again with collect.yml; the report shows the host without it)"


def read_status(path: Path) -> dict:
    return _status(path)[0]


def status_warning(path: Path) -> str | None:
    return _status(path)[1]


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}


def host_warnings(host_dir: Path) -> list[str]:
    return [w for w in (metrics_warning(host_dir / layout.METRICS), status_warning(host_dir / layout.STATUS)) if w]


def load_run(run_dir: Path) -> dict[str, dict]:
    hosts = {}
    for d in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        host = {"metrics": read_metrics(d / layout.METRICS), "status": read_status(d / layout.STATUS),
                "diagnosis": read_json(d / DIAGNOSIS), "warnings": host_warnings(d)}
        if host["metrics"] or host["status"] or host["diagnosis"]:
            hosts[d.name] = host
    return hosts


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, r in enumerate(records):
        if number(r.get(key)) is not None:
            step = number(r.get(metrics.STEP))
            xs.append(i if step is None else step)
            ys.append(number(r[key]))
    return xs, ys


def restart_rows(hosts: dict[str, dict]) -> list[tuple[str, int, int]]:
    """(host, start number, the step it resumed from) of every restart in the hosts' histories."""
    return [(name, r[metrics.INVOCATION], r[metrics.STEP])
            for name, h in hosts.items() for r in metrics.restarts(h["metrics"]) if number(r[metrics.STEP]) is not None]


def mark_restarts(ax, hosts: dict[str, dict]) -> None:
    """A dotted vertical line at each restart's resumed step (labelled once in the legend)."""
    for i, (name, start, step) in enumerate(restart_rows(hosts)):
        label = None if i else "restart (resumed here)"
        ax.axvline(step, color="0.35", linestyle=":", linewidth=1.2, label=label)
        ax.annotate(f"{name} #{start}" if len(hosts) > 1 else f"#{start}", (step, 1), xycoords=("data", "axes fraction"),
                    fontsize=7, color="0.35", ha="left", va="top", xytext=(2, -2), textcoords="offset points")


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plots(hosts: dict[str, dict]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = ("-", "--", ":", "-.")
    out = []
    for title, ylabel, keys, log in PLOTS:
        fig, ax = plt.subplots(figsize=(8, 3.6))
        drawn = 0
        for hi, (name, host) in enumerate(hosts.items()):
            for ki, (key, label) in enumerate(keys):
                xs, ys = _series(host["metrics"], key)
                if not ys:
                    continue
                lbl = f"{name}: {label}" if len(hosts) > 1 else label
                if len(ys) == 1:
                    ax.plot(xs, ys, marker="o", linestyle="", label=lbl, color=f"C{hi * len(keys) + ki}")
                else:
                    ax.plot(xs, ys, linestyle=styles[ki % len(styles)], label=lbl, color=f"C{hi * len(keys) + ki}")
                drawn += 1
        if not drawn:
            plt.close(fig)
            continue
        mark_restarts(ax, hosts)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        out.append((title, _png(fig)))
        plt.close(fig)
    for key, title, ylabel in BY_POSITION:
        fig, ax = plt.subplots(figsize=(8, 3.2))
        drawn = 0
        for hi, (name, host) in enumerate(hosts.items()):
            last = next((r for r in reversed(host["metrics"]) if isinstance(r.get(key), list) and r[key]), None)
            if last:
                ys = [math.nan if number(v) is None else number(v) for v in last[key]]  # null: no cycle reached it
                ax.plot(range(1, len(ys) + 1), ys, marker="o", color=f"C{hi}",
                        label=f"{name} (step {last.get(metrics.STEP)})")
                drawn += 1
        if drawn:
            ax.set_title(title)
            ax.set_xlabel("position in block")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            out.append((title.split(" (")[0], _png(fig)))
        plt.close(fig)
    return out


def _fmt(v, digits=4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def summary_rows(hosts: dict[str, dict]) -> list[list[str]]:
    rows = []
    for name, h in hosts.items():
        # The newest optimizer-step record (the evaluation's tau record at the end has no loss).
        last = next((r for r in reversed(h["metrics"]) if metrics.is_step(r)), {})
        newest = next((r for r in reversed(h["metrics"]) if isinstance(r.get(metrics.TAU), int | float)), {})
        tau = newest.get(metrics.TAU)
        d, s = h["diagnosis"], h["status"]
        rows.append([name, _fmt(d.get("verdict")), _fmt(s.get("phase")), _fmt(s.get("step", last.get(metrics.STEP))),
                     _fmt(s.get("epoch", last.get("epoch"))), _fmt(d.get("newest_checkpoint") or s.get("newest_checkpoint")),
                     _fmt(last.get(metrics.LOSS)), _fmt(last.get("accept_proxy")), _fmt(tau),
                     metrics.settings_label(newest) if newest else "-",
                     _fmt(last.get("target_tokens_per_s"), 6), _fmt(last.get("drafter_rows_per_s"), 6),
                     str(len(h["metrics"])), _fmt(d.get("reason") or None)])
    return rows


HEAD = ("host", "verdict", "phase", "step", "epoch", "newest checkpoint", "loss", "accept proxy", "tau",
        "tau measured with", "target tok/s", "drafter rows/s", "records", "reason")

CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;font-size:.9em}
td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}th{background:#f3f3f3}
figure{margin:1.5em 0}figcaption{font-weight:600;margin-bottom:.3em}img{max-width:100%}
.v-running,.v-completed{color:#176117}.v-unknown,.v-stopped{color:#7a5b00}.bad{color:#a01010}"""


def render(run: str, hosts: dict[str, dict], serve_check: dict | None = None) -> str:
    figs = plots(hosts) if any(h["metrics"] for h in hosts.values()) else []
    e = html.escape
    rows = []
    for r in summary_rows(hosts):
        cls = f"v-{r[1]}" if r[1] in ("running", "completed", "unknown", "stopped") else "bad"
        cells = [f"<td>{e(c)}</td>" for c in r]
        cells[1] = f'<td class="{cls}">{e(r[1])}</td>'
        rows.append("<tr>" + "".join(cells) + "</tr>")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>flashfleet run {e(run)}</title><style>{CSS}</style></head><body>",
        f"<h1>Run {e(run)}</h1>",
        f"<p>Generated {e(time.strftime('%Y-%m-%d %H:%M:%S %Z'))} from {len(hosts)} host(s).</p>",
        "<h2>Hosts</h2>", '<table id="summary"><thead><tr>' + "".join(f"<th>{e(h)}</th>" for h in HEAD)
        + "</tr></thead><tbody>", *rows, "</tbody></table>",
    ]
    warnings = [w for h in hosts.values() for w in h.get("warnings", [])]
    if warnings:
        parts[-1:-1] = ['<h2>Warnings</h2><ul id="warnings">', *(f'<li class="bad">{e(w)}</li>' for w in warnings),
                        "</ul>"]
    restarts = restart_rows(hosts)
    if restarts:
        parts += ["<h2>Restarts</h2>", "<p>Each restart resumed from a checkpoint; the records its dead "
                  "predecessor logged after that step are superseded (the dotted lines on the curves).</p>",
                  '<table id="restarts"><thead><tr><th>host</th><th>start</th><th>resumed from step</th></tr>'
                  "</thead><tbody>",
                  *(f"<tr><td>{e(h)}</td><td>{n}</td><td>{st}</td></tr>" for h, n, st in restarts),
                  "</tbody></table>"]
    if serve_check:  # before the curves: the figure a user serving the drafter will see
        parts += serve_check_part(serve_check)
    parts.append("<h2>Training curves</h2>")
    if not figs:
        parts.append("<p>No metrics records yet.</p>")
    for title, b64 in figs:
        parts.append(f'<figure class="plot"><figcaption>{e(title)}</figcaption>'
                     f'<img alt="{e(title)}" src="data:image/png;base64,{b64}"></figure>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def serve_check_part(check: dict) -> list[str]:
    """The report's lines for collect.yml's serve check: vLLM's acceptance beside dflash-eval's tau."""
    def part(key):  # a part that is not an object (a damaged file) shows as unknown
        return check.get(key) if isinstance(check.get(key), dict) else {}

    e, vllm, ours = html.escape, part("vllm"), part("dflash_eval")
    tau, theirs = number(ours.get(metrics.TAU)), number(vllm.get("tau"))
    gap = f" ({(theirs / tau - 1) * 100:+.1f}%)" if tau and theirs is not None else ""
    return ["<h2>Served by vLLM</h2>",
            f'<p id="serve-check">vLLM {e(str(vllm.get("vllm_version", "?")))} on {e(str(check.get("host")))}: mean '
            f"acceptance length <b>{_fmt(theirs)}</b> ({vllm.get('drafts', '?')} drafts, {vllm.get('accepted', '?')} "
            f"accepted); dflash-eval's tau on the same prompts ({check.get('prompts_per_set')} per set, "
            f"{check.get('max_new_tokens')} new tokens, {e(metrics.settings_label(ours))}): "
            f"<b>{_fmt(tau)}</b>{gap}.</p>"]


def write_report(run_dir: Path, output: Path | None = None) -> Path:
    run_dir = Path(run_dir)
    hosts = load_run(run_dir)
    output = Path(output) if output else run_dir / "report.html"
    tmp = output.with_suffix(".html.tmp")
    tmp.write_text(render(run_dir.name, hosts, read_json(run_dir / SERVE_CHECK)))
    tmp.replace(output)
    return output


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, help="runs/<run> as collect.yml wrote it")
    ap.add_argument("-o", "--output", type=Path, help="default: RUN_DIR/report.html")
    args = ap.parse_args(argv)
    fix = "(fix: pass runs/<run> as collect.yml wrote it; run collect.yml first)"
    if not args.run_dir.is_dir():
        print(f"{args.run_dir}: not a directory {fix}", file=sys.stderr)
        return 2
    hosts = load_run(args.run_dir)
    for d in sorted(p for p in args.run_dir.iterdir() if p.is_dir()):
        # a host left out for having no readable record is named too (its file may be all bad)
        for warning in hosts[d.name]["warnings"] if d.name in hosts else host_warnings(d):
            print(f"warning: {warning}", file=sys.stderr)
    if not hosts:
        print(f"{args.run_dir}: not a run directory: no host directory in it has {layout.METRICS}, "
              f"{layout.STATUS} or {DIAGNOSIS} {fix}", file=sys.stderr)
        return 2
    try:
        print(write_report(args.run_dir, args.output))
    except OSError as exc:
        print(f"{args.output or args.run_dir / 'report.html'}: cannot write the report: {exc.strerror or exc} "
              "(fix: pass -o PATH in a writable directory)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""docs/benchmarks.md and the GPU driver (tests/benchmarks/gpu.sh) kept in step, without a GPU.

The driver's calls and the calls the docs name are the same set; every call runs through (bash's
own errors: unbound variables, typos, a missing tree) with stand-ins for python3 and nvidia-smi
that only record what they were asked; bad input is one line, exit 78, nothing written. The manual
keeps one table per area whose every row names its command and its date, and a GPU row names the
driver's call; the journal is mentioned by the manual alone.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

DRIVER = ROOT / "tests/benchmarks/gpu.sh"
MANUAL = ROOT / "docs/benchmarks.md"
JOURNAL = ROOT / "docs/benchmarks-journal.md"
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
# The areas of the manual, each with its table of current figures.
AREAS = ("The loss kernel", "The drafter step", "The target", "The whole trainer step",
         "Evaluation and drafter quality", "vLLM", "The test suite's time", "Demo, provisioning and launch",
         "Dataset staging", "Kernel and driver builds")
# What each call must run (a module or script its stand-in python3 is asked for).
RUNS = {
    "loss": "bench_loss", "loss-final": "bench_loss", "loss-fp8": "bench_loss", "loss-skip": "bench_loss",
    "drafter-spread": "gemm_ceiling.py", "drafter-ab": "bench_drafter", "drafter-bf16": "bench_drafter",
    "drafter27": "bench_drafter", "drafter-kinds": "bench_drafter", "conv": "bench_grouped_conv",
    "codebook-grad": "bench_codebook_grad",
    "drafter-profile": "bench_flex.py", "prep-ab": "bench_prep.py",
    "tau-fp8": "bench_tau_settings.py", "e2e-compile": "bench_prep.py", "e2e-anchors": "bench_prep.py",
    "e2e-27b": "bench_prep.py", "target": "bench_target", "target-compile": "bench_target",
    "target-fuse": "bench_target", "target-profile": "bench_target", "target-autotune": "bench_target",
    "target-short-conv": "attn_backends.py", "eval-cache": "bench_eval_cache",
    "eval-hybrid-cache": "bench_eval_hybrid_cache",
}


def driver_calls(text: str | None = None) -> set[str]:
    text = DRIVER.read_text() if text is None else text
    return {m.replace("_", "-") for m in re.findall(r"^call_([a-z0-9_]+)\(\)", text, re.M)}


def code_of(text: str) -> list[str]:
    """The Markdown's code: inline spans and indented or fenced block lines."""
    spans = re.findall(r"`([^`\n]+)`", text)
    lines = [ln for ln in text.splitlines() if ln.startswith("    ")]
    return spans + lines


def named_calls(text: str) -> set[str]:
    """The calls a document names: the words after `tests/benchmarks/gpu.sh` in its code."""
    names = set()
    for code in code_of(text):
        for m in re.finditer(r"tests/benchmarks/gpu\.sh((?: +[a-z][a-z0-9-]*)+)", code):
            names.update(m.group(1).split())
    return names - {"list"}


def test_driver_parses():
    assert subprocess.run(["bash", "-n", str(DRIVER)], capture_output=True).returncode == 0


def test_the_docs_name_exactly_the_drivers_calls():
    calls = driver_calls()
    assert calls == set(RUNS), "a call was added or removed: say here what it runs"
    for doc in DOCS:
        unknown = named_calls(doc.read_text()) - calls
        assert not unknown, f"{doc.name} names calls the driver does not have: {sorted(unknown)}"
    unnamed = calls - named_calls(MANUAL.read_text())
    assert not unnamed, f"docs/benchmarks.md never names these calls of the driver: {sorted(unnamed)}"


def test_the_retired_scripts_are_named_only_in_the_journals_map():
    """The per-measurement scripts the driver replaced: only the journal (history) names them, and
    its map says which call each became."""
    old = re.compile(r"gpu_[a-z0-9_]+_(?:batch|common)\.sh")
    assert not list((ROOT / "tests/benchmarks").glob("gpu_*_batch.sh"))
    for doc in DOCS:
        if doc != JOURNAL:
            assert not old.findall(doc.read_text()), f"{doc.name} names a retired script"
    journal = JOURNAL.read_text()
    mapped = dict(re.findall(r"^\| `(gpu_[a-z0-9_]+\.sh)[^|]*\| `[^`]*tests/benchmarks/gpu\.sh ([a-z0-9-]+)[^|]*\|", journal, re.M))
    for name in set(old.findall(journal)) - {"gpu_drafter_common.sh", "gpu_target_common.sh"}:
        assert name in mapped, f"the journal names {name} but its map does not say which call replaced it"
        assert mapped[name] in driver_calls()


def _stand_ins(tmp: Path) -> tuple[Path, dict]:
    """A copy of the driver in a tree of its own (so that the build/ copies it checks for exist there),
    and python3 / nvidia-smi stand-ins that append their arguments to a record and succeed."""
    root = tmp / "repo"
    (root / "tests/benchmarks").mkdir(parents=True)
    shutil.copy(DRIVER, root / "tests/benchmarks/gpu.sh")
    for code in ("before", "head", "prep-before"):
        (root / "build" / code / "trainer/flashfleet_trainer").mkdir(parents=True)
    bin_ = tmp / "bin"
    bin_.mkdir()
    record = tmp / "record.txt"
    # python3 -m flashfleet_trainer.shapes DIR: make DIR/model, as the real one writes the checkpoint there
    (bin_ / "python3").write_text(f"""#!/bin/bash
echo "python3 $*" >> {record}
if [ "$1" = -m ] && [ "$2" = flashfleet_trainer.shapes ]; then mkdir -p "$3/model"; fi
if [ "$1" = -c ]; then echo "torch 0 triton 0"; fi
exit 0
""")
    (bin_ / "nvidia-smi").write_text(f"#!/bin/bash\necho \"nvidia-smi $*\" >> {record}\necho 'Stand-in GPU, 0, 700 W'\n")
    for f in bin_.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SCRATCH": str(tmp / "scratch"),
           "TMPDIR": str(tmp), "ANCHOR": str(DRIVER), "ASSETS": str(tmp)}
    for knob in ("CODES", "TESTS", "EXTRA", "QUICK", "PARTS", "MORE_ANCHORS", "PLAIN", "GEMM", "WITH_27B", "NO_27B",
                 "ANCHORS", "KERNELS", "BENCH_S", "TESTS_S", "ROUNDS"):
        env.pop(knob, None)
    return root, env


@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_call_runs_its_programs(tmp_path, name):
    root, env = _stand_ins(tmp_path)
    out = tmp_path / "out"
    env.update(OUT=str(out), PLAIN="1", MORE_ANCHORS="1024", GEMM="1", WITH_27B="1", TESTS="tests/unit/x.py")
    r = subprocess.run(["bash", "tests/benchmarks/gpu.sh", name], cwd=root, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not re.search(r"unbound variable|command not found|syntax error|No such file", r.stderr), r.stderr
    record = (tmp_path / "record.txt").read_text()
    assert RUNS[name] in record, f"{name} never ran {RUNS[name]}"
    assert "--query-gpu=timestamp,power.draw,clocks.sm" in record  # the clock log beside the runs
    assert f"== {name} done in" in (out / f"{name}.txt").read_text()
    assert "failed" not in (out / f"{name}.txt").read_text()


def test_the_set_up_is_once_for_several_calls(tmp_path):
    root, env = _stand_ins(tmp_path)
    env["OUT"] = str(tmp_path / "out")
    r = subprocess.run(["bash", "tests/benchmarks/gpu.sh", "target", "eval-cache"], cwd=root, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    record = (tmp_path / "record.txt").read_text()
    assert record.count("-lms 500") == 1 and record.count("import torch, triton") == 1
    assert (tmp_path / "out/target.txt").exists() and (tmp_path / "out/eval-cache.txt").exists()


@pytest.mark.parametrize(("args", "env", "says"), [
    (["nosuch"], {}, "no call 'nosuch'"),
    (["loss_final"], {}, "no call 'loss_final'"),
    (["target", "nosuch"], {}, "no call 'nosuch'"),
    (["loss-final"], {"ANCHOR": ""}, "needs ANCHOR=FILE"),
    (["drafter-ab"], {"CODES": "gone after"}, "no build/gone/trainer/flashfleet_trainer"),
    (["tau-fp8"], {"ASSETS": "/nonexistent"}, "needs ASSETS=DIR"),
    ([], {}, "name a call"),
    (["target"], {"OUT": ""}, "set OUT"),
])
def test_bad_input_is_one_line_78_and_nothing_runs(tmp_path, args, env, says):
    root, full_env = _stand_ins(tmp_path)
    out = tmp_path / "out"
    full_env.update({"OUT": str(out), **env})
    r = subprocess.run(["bash", "tests/benchmarks/gpu.sh", *args], cwd=root, env=full_env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 78
    assert len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr
    assert not out.exists() and not (tmp_path / "record.txt").exists()


def test_list_names_every_call_with_what_it_measures():
    r = subprocess.run(["bash", str(DRIVER), "list"], capture_output=True, text=True, timeout=60)
    listed = {ln.split(":")[0] for ln in r.stdout.splitlines()}
    assert r.returncode == 0 and listed == driver_calls()
    assert all(len(ln.split(": ", 1)[1]) > 20 for ln in r.stdout.splitlines())


def sections(text: str) -> dict[str, str]:
    """The manual's `## ` sections by title."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def figure_tables(body: str) -> list[tuple[list[str], list[list[str]]]]:
    """The tables of a section that have a date and a command column: (header, rows)."""
    tables, lines = [], body.splitlines()
    for i, ln in enumerate(lines):
        if ln.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[ :|-]+\|$", lines[i + 1]):
            head = [c.strip() for c in ln.strip("|").split("|")]
            if "date" in head and "command" in head:
                rows, j = [], i + 2
                while j < len(lines) and lines[j].startswith("|"):
                    rows.append([c.strip() for c in re.split(r"(?<!\\)\|", lines[j].strip().strip("|"))])
                    j += 1
                tables.append((head, rows))
    return tables


def test_every_area_has_its_table_and_every_row_its_command_and_date():
    secs = sections(MANUAL.read_text())
    for area in AREAS:
        assert area in secs, f"docs/benchmarks.md has no section '## {area}'"
        tables = figure_tables(secs[area])
        assert tables, f"'## {area}' has no table of figures with a date and a command column"
        for head, rows in tables:
            assert rows
            for row in rows:
                cell = dict(zip(head, row, strict=False))
                assert len(row) == len(head), f"{area}: a row with {len(row)} cells under {len(head)} columns: {row}"
                assert re.fullmatch(r"2026-\d\d-\d\d", cell["date"]), f"{area}: a row without a date: {row}"
                assert "`" in cell["command"], f"{area}: a row without a command: {row}"
                if re.match(r"(\d+ x )?H[12]00\b", cell["card"]):
                    assert "tests/benchmarks/gpu.sh " in cell["command"], f"{area}: a GPU row not run by the driver: {row}"


def test_the_journal_is_history_that_only_the_manual_mentions():
    assert JOURNAL.exists()
    assert MANUAL.read_text().count("benchmarks-journal.md") == 1
    tracked = subprocess.run(["git", "grep", "-l", "--untracked", "benchmarks-journal", "--", ".", ":!tests/unit/test_benchmarks_docs.py"],
                             cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert tracked in ([], ["docs/benchmarks.md"]), f"only the manual mentions the journal: {tracked}"


def test_a_section_of_the_manual_named_elsewhere_exists():
    """`docs/benchmarks.md, "Area"` in the docs and the code names a section the manual has."""
    titles = [" ".join(t.split()) for t in sections(MANUAL.read_text())]
    files = subprocess.run(["git", "grep", "-l", "benchmarks.md", "--", "*.md", "*.py", "*.yml", "*.sh"],
                           cwd=ROOT, capture_output=True, text=True).stdout.split()
    for name in files:
        if name in ("docs/benchmarks-journal.md", "tests/unit/test_benchmarks_docs.py"):
            continue
        text = (ROOT / name).read_text()
        for m in re.finditer(r"benchmarks\.md(?:'s)?[^)]{0,160}?\)", text, re.S):
            for quoted in re.findall(r'"([^"]+)"', m.group(0)):
                quoted = " ".join(quoted.split())
                assert any(t.startswith(quoted) for t in titles), f"{name} names a section the manual lacks: {quoted!r}"

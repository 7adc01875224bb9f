"""dflash-train parses its command line once into a frozen RunConfig: each setting is its flag when
given, else its --config key, else its default; nothing after parse_args changes it."""

import ast
import dataclasses
import json
import pickle
from pathlib import Path

import pytest
from flashfleet.plan.settings import SECTIONS
from flashfleet_trainer import config
from flashfleet_trainer.config import RunConfig, parse_args
from flashfleet_trainer.errors import CliParser

BASE = ["--target-model", "/m", "--data-dir", "/d", "--output-dir", "/o"]
PACKAGE = Path(config.__file__).parent


def test_parse_args_gives_a_frozen_runconfig_that_crosses_processes():
    cfg = parse_args([*BASE, "--lr", "1e-4"])
    assert isinstance(cfg, RunConfig) and cfg.lr == cfg.optimisation.lr == 1e-4
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.optimisation.lr = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.loss = None
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # what a spawned rank or worker receives


def test_replace_is_a_copy_and_refuses_an_unknown_name():
    cfg = parse_args(BASE)
    other = cfg.replace(max_steps=4, resume="never")
    assert (other.max_steps, other.resume, cfg.max_steps, cfg.resume) == (4, "never", None, "auto")
    assert other.replace(max_steps=None, resume="auto") == cfg
    with pytest.raises(KeyError, match="max_step"):
        cfg.replace(max_step=4)


def test_config_is_parsed_once(tmp_path, monkeypatch):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"lr": 1e-4}))
    calls = []
    parse = CliParser.parse_known_args
    monkeypatch.setattr(CliParser, "parse_known_args", lambda self, *a, **k: (calls.append(a), parse(self, *a, **k))[1])
    assert parse_args([*BASE, "--config", str(path)]).lr == 1e-4
    assert len(calls) == 1, calls


def test_a_given_flag_beats_the_json_even_at_its_default_and_json_strings_convert(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"lr": 1e-4, "save_interval": "5", "epochs": "2.5", "target_layers": "1,3"}))
    default_lr = config.FIELDS["lr"].default
    cfg = parse_args([*BASE, "--config", str(path), "--lr", str(default_lr)])
    assert (cfg.lr, cfg.save_interval, cfg.epochs, cfg.target_layers) == (default_lr, 5, 2.5, "1,3")
    assert cfg.config == str(path)


def test_help_is_the_same_with_or_without_defaults():
    assert config.build_parser(given_only=True).format_help() == config.build_parser().format_help()


def section_reads(source: str) -> list[tuple[int, str, str, bool]]:
    """(line, section, name, whether the section has that field) of every `cfg.SECTION.NAME` (or
    `args.` / `a.`) read in `source`."""
    return sorted((n.lineno, n.value.attr, n.attr, n.attr in {f.name for f in dataclasses.fields(SECTIONS[n.value.attr])})
                  for n in ast.walk(ast.parse(source))
                  if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr in SECTIONS
                  and isinstance(n.value.value, ast.Name) and n.value.value.id in ("cfg", "args", "a"))


def test_every_section_read_in_the_trainer_names_a_field_of_that_section():
    """What the settings views checked at import, for the reads that replaced them: a misspelt or
    moved setting fails here, not at a run's first evaluation."""
    reads = {f.name: section_reads(f.read_text()) for f in sorted(PACKAGE.glob("*.py"))}
    wrong = [f"{name}:{line}: {sec}.{field}" for name, rs in reads.items() for line, sec, field, ok in rs if not ok]
    assert not wrong, f"no such field of that section: {wrong}"
    found = {(sec, field) for rs in reads.values() for _, sec, field, _ in rs}
    assert {("eval", "eval_thinking"), ("topology", "server_check_every"), ("paths", "target_model")} <= found


def test_the_section_read_check_finds_a_misspelt_or_misplaced_name():
    source = "def f(cfg):\n    return cfg.loss.kl_weigth + cfg.optimisation.seed + cfg.eval.seed + other.loss.x\n"
    assert section_reads(source) == [(2, "eval", "seed", False), (2, "loss", "kl_weigth", False),
                                     (2, "optimisation", "seed", True)]

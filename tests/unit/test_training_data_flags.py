"""roles/training_data/filter_plugins/dflash_data.py: a run's `data:` entry as dflash-data's flags
(tests/playbooks/test_data_playbook.py runs the role that uses it against the real program)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("dflash_data", ROOT / "roles/training_data/filter_plugins/dflash_data.py")
dd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dd)


def test_each_kind_of_value_becomes_its_flags_in_name_order():
    entry = {"max_len": 2048, "input": ["a.jsonl", "b.jsonl"], "shuffle": True, "keep_going": False,
             "seed": None, "temperature": 0.7}
    assert dd.dflash_data_flags(entry) == ["--input", "a.jsonl", "b.jsonl", "--max-len", "2048", "--shuffle",
                                           "--temperature", "0.7"]


def test_nothing_gives_no_flags():
    assert dd.dflash_data_flags({}) == [] and dd.dflash_data_flags(None) == []


def test_the_flags_are_what_dflash_data_parses():
    """Every flag the filter makes from a build entry is one dflash-data's own parser accepts."""
    from flashfleet_trainer import data_cli

    flags = dd.dflash_data_flags({"input": ["x.jsonl", "y.jsonl"], "max_len": 64, "per_turn": True,
                                  "no_dedup": False, "temperature": 0.5})
    args = data_cli.parse_args(["regenerate", "--model", "m", "--out", "o", "--server", "http://h:1", *flags])
    assert (args.input, args.max_len, args.per_turn, args.no_dedup, args.temperature) == \
        (["x.jsonl", "y.jsonl"], 64, True, False, 0.5)


@pytest.mark.parametrize("name", ["--max-len", "-x", ""])
def test_a_name_with_dashes_is_refused(name):
    # the filter raises this text as an AnsibleFilterError (not raised here: importing Ansible in
    # the test process would break torch's compiler for the tests after it)
    assert "without dashes, e.g. max_len" in dd.name_problem(name)
    assert dd.name_problem("max_len") is None

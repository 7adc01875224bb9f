"""The run plan's data_flags: a run's `data:` entry as dflash-data's flags (flashfleet.plan.run;
tests/playbooks/test_data_playbook.py runs the role that uses it against the real program)."""

from __future__ import annotations

import pytest
from flashfleet.plan import run as plan


def test_each_kind_of_value_becomes_its_flags_in_name_order():
    entry = {"max_len": 2048, "input": ["a.jsonl", "b.jsonl"], "shuffle": True, "keep_going": False,
             "seed": None, "temperature": 0.7}
    assert plan.data_flags(entry) == ["--input", "a.jsonl", "b.jsonl", "--max-len", "2048", "--shuffle",
                                           "--temperature", "0.7"]


def test_nothing_gives_no_flags():
    assert plan.data_flags({}) == [] and plan.data_flags(None) == []


def test_the_flags_are_what_dflash_data_parses():
    """Every flag the filter makes from a build entry is one dflash-data's own parser accepts."""
    from flashfleet_trainer import data_cli

    flags = plan.data_flags({"input": ["x.jsonl", "y.jsonl"], "max_len": 64, "per_turn": True,
                                  "no_dedup": False, "temperature": 0.5})
    args = data_cli.parse_args(["regenerate", "--model", "m", "--out", "o", "--server", "http://h:1", *flags])
    assert (args.input, args.max_len, args.per_turn, args.no_dedup, args.temperature) == \
        (["x.jsonl", "y.jsonl"], 64, True, False, 0.5)


@pytest.mark.parametrize("name", ["--max-len", "-x", ""])
def test_a_name_with_dashes_is_refused(name):
    with pytest.raises(plan.PlanError, match="without dashes, e.g. max_len"):
        plan.data_flags({name: 1})
    assert plan.data_flags({"max_len": 1}) == ["--max-len", "1"]

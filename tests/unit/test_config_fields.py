"""RunConfig is the one definition of dflash-train's settings: every bound, type and choice a field
declares is enforced from it, on the command line and in --config alike, and nothing else decides."""

import json

import pytest
from flashfleet_trainer import config
from flashfleet_trainer.config import FIELDS, build_parser, flag, parse_args, rule
from flashfleet_trainer.defaults import BLOCK_SIZE
from flashfleet_trainer.errors import ConfigError

BASE = ["--target-model", "/m", "--data-dir", "/d", "--output-dir", "/o"]
BOUNDED = [f for f in FIELDS.values() if rule(f)]


def _edges(f):
    """(just outside, just inside) for each side the field bounds."""
    m, step = f.metadata, (1 if config.base_type(f) is int else 1e-6)
    out = []
    if m["ge"] is not None:
        out.append((m["ge"] - step, m["ge"]))
    if m["gt"] is not None:
        out.append((m["gt"], m["gt"] + step))
    if m["le"] is not None:
        out.append((m["le"] + step, m["le"]))
    if m["lt"] is not None:
        out.append((m["lt"], m["lt"] - step))
    return out


def _valid_beside(name, value):
    """Other fields set so that a value just inside `name`'s bounds passes the cross-field rules."""
    extra = {"token_budget": value} if name == "max_seq_len" else {}
    if name == "token_budget":
        extra = {"max_seq_len": min(value, 2)}
    if name == "nnodes" and value > 1:
        extra = {"rdzv_endpoint": "node0:29400"}
    return [x for k, v in extra.items() for x in (flag(k), str(v))]


def test_the_definition_bounds_the_settings_the_issue_lists():
    assert len(BOUNDED) >= 40 and {"lr", "block_size", "kl_weight", "server_gpus", "plan_steps"} <= {f.name for f in BOUNDED}


@pytest.mark.parametrize("f", BOUNDED, ids=lambda f: f.name)
def test_every_bound_is_enforced_on_the_command_line_and_stated_in_help(f):
    helptext = " ".join(build_parser().format_help().split())
    assert f"({rule(f)}" in helptext
    for outside, inside in _edges(f):
        with pytest.raises(ConfigError) as e:
            parse_args([*BASE, flag(f.name), str(outside), *_valid_beside(f.name, inside)])
        assert e.value.what.startswith(f"{flag(f.name)} ") and f"must be {rule(f)}" in e.value.what
        a = parse_args([*BASE, flag(f.name), str(inside), *_valid_beside(f.name, inside)])
        assert getattr(a, f.name) == inside


@pytest.mark.parametrize("f", BOUNDED, ids=lambda f: f.name)
def test_every_bound_is_enforced_in_config_json(f, tmp_path):
    outside, _ = _edges(f)[0]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"target_model": "/m", "data_dir": "/d", "output_dir": "/o", f.name: outside}))
    with pytest.raises(ConfigError, match=f"^{flag(f.name)} .*must be"):
        parse_args(["--config", str(path), *_valid_beside(f.name, _edges(f)[0][1])])


def test_parser_is_generated_from_the_fields():
    parser = build_parser()
    dests = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert set(dests) == set(FIELDS)
    for name, f in FIELDS.items():
        negated = ["--no-" + flag(name)[2:]] if config.base_type(f) is bool else []  # a true default can be cleared
        assert dests[name].default == f.default and dests[name].option_strings == [flag(name), *negated]
        assert dests[name].choices == f.metadata["choices"]


def test_defaults_are_the_dataclass_defaults():
    a = parse_args(BASE).to_flat()
    assert config.RunConfig.from_flat(a).to_flat() == a
    # block_size's default (None) is the drafter kind's, filled by parse_args (config.kind_defaults)
    assert a["block_size"] == BLOCK_SIZE[a["drafter_kind"]] and FIELDS["block_size"].default is None
    skip = ("target_model", "data_dir", "output_dir", "block_size")
    assert {k: v for k, v in a.items() if k not in skip} == {
        name: f.default for name, f in config.FIELDS.items() if name not in skip}


@pytest.mark.parametrize("key, near", [("lerning_rate", None), ("use_soft_label", "use_soft_labels"),
                                       ("block", "block_size"), ("num_draft_layer", "num_draft_layers")])
def test_unknown_config_key_names_the_key_and_the_nearest_field(key, near, tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"target_model": "/m", "data_dir": "/d", "output_dir": "/o", key: 1}))
    with pytest.raises(ConfigError) as e:
        parse_args(["--config", str(path)])
    assert f"unknown key {key!r}" in e.value.what
    if near:
        assert f"did you mean {near!r}?" == e.value.fix


@pytest.mark.parametrize("key, value, says", [
    ("block_size", "x", "invalid int value"), ("block_size", 2.5, "is not an integer"), ("lr", [1], "is not a number"),
    ("lr", True, "is not a number"), ("use_soft_labels", 1, "must be true or false"),
    ("attn_impl", "fast", "is not one of auto, dense, flex"), ("target_layers", [1, 2], "is not a string"),
])
def test_wrong_config_types_are_refused(key, value, says, tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"target_model": "/m", "data_dir": "/d", "output_dir": "/o", key: value}))
    with pytest.raises(ConfigError, match=says):
        parse_args(["--config", str(path)])


def test_every_field_has_a_doc_a_group_and_a_type():
    for f in FIELDS.values():
        assert f.metadata["doc"] and f.metadata["group"], f.name
        assert config.base_type(f) in (int, float, str, bool), f.name


def test_docs_flag_table_is_the_generated_one():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "trainer.md").read_text()
    table = doc.split("<!-- flags: generated, do not edit by hand -->\n", 1)[1].split("<!-- end flags -->", 1)[0]
    assert table == config.markdown_table(), "regenerate: python -m flashfleet_trainer.config --markdown"


@pytest.mark.parametrize("argv, says", [
    (["--block-size", "1"], "--block-size 1: must be >= 2"),
    (["--num-draft-layers", "0"], "--num-draft-layers 0: must be >= 1"),
    (["--max-new-tokens", "0"], "--eval-max-new-tokens 0: must be >= 1"),  # dflash-eval's older name, one field
    (["--temperature", "-1"], "--eval-temperature -1.0: must be >= 0"),
    (["--seed", "-1"], "--seed -1: must be >= 0"),
])
def test_dflash_eval_shares_the_trainers_fields_and_bounds(argv, says, capsys):
    from flashfleet.contract.messages import EX_CONFIG
    from flashfleet_trainer.evaluate import main

    assert main(["--target-model", "/m", "--prompts", "/p.jsonl", *argv]) == EX_CONFIG
    assert says in capsys.readouterr().err

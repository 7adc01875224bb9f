"""The train_unit role passes a run's `trainer` settings through to dflash-train --config: every key
the role writes or reads there, and every option its argument spec declares for them, is a field of
the trainer's one definition (config.RunConfig), of the same type."""

import re
from pathlib import Path

import yaml
from flashfleet_trainer.config import FIELDS, base_type

ROLE = Path(__file__).parents[2] / "roles" / "train_unit"
ANSIBLE_TYPE = {str: "str", int: "int", float: "float", bool: "bool"}


def _trainer_spec() -> dict:
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    return spec["argument_specs"]["main"]["options"]["train_unit_spec"]["options"]["trainer"]


def test_argument_spec_options_of_trainer_are_fields_of_the_same_type():
    for key, option in (_trainer_spec().get("options") or {}).items():
        assert key in FIELDS, f"argument_specs.yml: trainer.{key} is not a dflash-train setting"
        want = ANSIBLE_TYPE[base_type(FIELDS[key])]
        assert option.get("type", "str") == want or (want == "float" and option.get("type") == "int"), key


def _keys_the_role_writes() -> dict[str, str]:
    """'key' -> the role's value expression, from vars/main.yml's dicts combined into the run's config."""
    text = (ROLE / "vars" / "main.yml").read_text()
    block = re.findall(r"^(train_unit_(?:trainer|node|vllm)_config): >-\n((?:  .*\n)+)", text, re.M)
    assert {name for name, _ in block} == {"train_unit_trainer_config", "train_unit_node_config",
                                             "train_unit_vllm_config"}
    return {k: v for _, body in block for k, v in re.findall(r"'(\w+)': ([^,}]+)", body)}


def test_keys_the_role_writes_into_the_run_config_are_fields():
    written = _keys_the_role_writes()
    assert {"output_dir", "target_servers", "nnodes", "node_rank", "rdzv_endpoint", "wandb_project"} <= set(written)
    for key in written:
        assert key in FIELDS, f"vars/main.yml writes {key!r}, which dflash-train does not know"
    assert base_type(FIELDS["nnodes"]) is int and "length" in written["nnodes"]  # a count, not a string
    assert base_type(FIELDS["wandb_settings"]) is str and "to_json" in written["wandb_settings"]


def test_settings_the_role_reads_are_fields():
    text = "".join(p.read_text() for p in (ROLE / "vars").glob("*.yml")) + "".join(
        p.read_text() for p in (ROLE / "tasks").glob("*.yml"))
    read = set(re.findall(r"dflash_train_setting\('(\w+)'\)", text)) | set(
        re.findall(r"train_unit_spec\.trainer\.(\w+)", text))
    assert read >= {"target_gpus", "drafter_gpus", "target_model"}
    assert read <= set(FIELDS), read - set(FIELDS)

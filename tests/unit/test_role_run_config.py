"""The train_unit role passes a run's `trainer` settings through to dflash-train --config: every key
the run plan writes there, every one the role reads, and every option its argument spec declares
for them, is a field of the one definition (flashfleet.plan.settings.RunConfig), of the same type."""

import re
from pathlib import Path

import yaml
from flashfleet.plan.run import plan_run
from flashfleet.plan.settings import FIELDS, base_type

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


def test_keys_the_plan_writes_into_the_run_config_are_fields():
    entry = {"trainer": {"target_model": "/m"}, "vllm": {"servers": [{"port": 8100, "gpus": "0"}]},
             "wandb": {"project": "p", "run_name": "r", "settings": {"x": 1}}}
    written = plan_run("v2", entry, hosts=["a", "b"], host="b", rdzv_host="10.0.0.1", runs_root="/r")["trainer"]
    assert {"output_dir", "target_servers", "nnodes", "node_rank", "rdzv_endpoint", "wandb_project",
            "wandb_settings"} <= set(written)
    for key, value in written.items():
        assert key in FIELDS, f"the plan writes {key!r}, which dflash-train does not know"
        assert isinstance(value, base_type(FIELDS[key])), (key, value)


def test_settings_the_role_reads_are_fields():
    text = "".join(p.read_text() for p in (ROLE / "vars").glob("*.yml")) + "".join(
        p.read_text() for p in (ROLE / "tasks").glob("*.yml"))
    read = set(re.findall(r"train_unit_spec\.trainer\.(\w+)", text))
    assert read >= {"target_model"}
    assert read <= set(FIELDS), read - set(FIELDS)

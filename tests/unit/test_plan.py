"""The run plan (flashfleet.plan): plan_run derives what one host of a run receives, once, and
refuses a malformed entry with the entry check's own lines; the GPU-list grammar has one parser,
which the trainer's device parsing uses too. (What the roles render from it, byte for byte:
tests/playbooks/test_plan_golden.py.)"""

from __future__ import annotations

import pytest
from flashfleet.plan import gpus
from flashfleet.plan.entry import run_entry_problems
from flashfleet.plan.run import SERVER_BIND, PlanError, plan_run
from flashfleet.plan.settings import FIELDS, SECTION_OF, RunConfig
from flashfleet_trainer.config import parse_devices
from flashfleet_trainer.errors import ConfigError

ADA = {"trainer": {"target_model": "/m", "data_dir": "/d", "drafter_gpus": "4,5"},
       "vllm": {"servers": [{"port": 8100, "gpus": "0,1"}, {"port": "8101", "gpus": 2}],
                "args": {"tensor-parallel-size": 2, "enforce-eager": True}},
       "data": {"input": ["/c.jsonl"], "regenerate": {"temperature": 0.7}}}


def _plan(entry, **kw):
    return plan_run("v2", entry, **{"hosts": ["h1"], "host": "h1", "runs_root": "/runs", **kw})


def test_servers_get_their_unit_url_bind_address_and_gpus_from_the_plan_alone():
    p = _plan(ADA, vllm_venv="/vv")
    assert [s["url"] for s in p["servers"]] == ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]
    assert {s["bind"] for s in p["servers"]} == {SERVER_BIND} and p["servers"][0]["argv"][-4:] == [
        "--host", SERVER_BIND, "--port", "8100"]
    assert p["server_units"] == ["flashfleet-vllm@v2-0.service", "flashfleet-vllm@v2-1.service"]
    assert [s["cuda_visible_devices"] for s in p["servers"]] == ["0,1", "2"]
    assert p["servers"][0]["flags"] == ["--enforce-eager", "--tensor-parallel-size", "2"]
    # the trainer and dflash-data reach the servers at the same URLs
    assert p["trainer"]["target_servers"] == "http://127.0.0.1:8100,http://127.0.0.1:8101"
    assert p["data"]["argv"][p["data"]["argv"].index("--server") + 1] == "http://127.0.0.1:8100"


@pytest.mark.parametrize("trainer, servers, expected", [
    ({}, [], [0, 0]),  # dflash-train's own defaults: target 0, drafter 0
    ({"target_gpus": "cpu", "drafter_gpus": "cpu"}, [], []),
    ({"target_gpus": "0,1,2", "drafter_gpus": 3}, [], [0, 1, 2, 3]),
    ({"drafter_gpus": "4,5"}, [{"port": 8000, "gpus": "0,1"}], [4, 5, 0, 1]),  # target_gpus unused with servers
    ({"target_gpus": "6", "drafter_gpus": "4"}, [{"port": 8000}], [6, 4]),     # a server without gpus runs on CPU
])
def test_the_gpus_are_the_runs_own_or_the_trainers_defaults(trainer, servers, expected):
    entry = {"trainer": trainer, **({"vllm": {"servers": servers}} if servers else {})}
    assert _plan(entry)["gpus"] == expected
    assert FIELDS["target_gpus"].default == FIELDS["drafter_gpus"].default == "0"


def test_a_run_on_several_hosts_gets_each_its_rank_and_the_first_hosts_rendezvous():
    entry = {"trainer": {}, "rdzv_port": 29500}
    ranks = [_plan(entry, hosts=["a", "b", "c"], host=h, rdzv_host="10.0.0.1")["trainer"] for h in "abc"]
    assert [(t["nnodes"], t["node_rank"], t["rdzv_endpoint"]) for t in ranks] == [
        (3, i, "10.0.0.1:29500") for i in range(3)]
    assert "nnodes" not in _plan(entry)["trainer"]  # one host: no rendezvous


def test_data_checks_its_own_flags_only_and_names_what_is_missing():
    p = _plan(ADA)
    assert p["data"]["check_config"] == {**ADA["trainer"], "output_dir": "/runs/v2"}  # no servers: not up yet
    assert p["data"]["problem"] == ""
    assert "data.input" in _plan({"trainer": ADA["trainer"]})["data"]["problem"]


@pytest.mark.parametrize("entry", [{"trainer": ["x"]}, {"vllm": {"servers": [{"port": 8100}, {"port": 8100}]}},
                                   {"trainer": {"target_servers": "http://x:1"}, "vllm": {"servers": [{"port": 8100}]}}])
def test_a_malformed_entry_is_refused_with_the_entry_checks_lines(entry):
    with pytest.raises(PlanError) as e:
        _plan(entry)
    assert str(e.value) == "; ".join(run_entry_problems("v2", entry))


def test_sections_own_their_fields_under_flat_names():
    cfg = RunConfig.from_flat({"lr": 1e-3, "eval_top_k": 20, "drafter_kind": "dflash2"})
    assert (cfg.optimisation.lr, cfg.eval.eval_top_k, cfg.drafter.drafter_kind) == (1e-3, 20, "dflash2")
    assert cfg.lr == 1e-3 and cfg.to_flat()["eval_top_k"] == 20
    assert SECTION_OF["ce_target"] == "loss" and SECTION_OF["eval_thinking"] == "eval"
    with pytest.raises(KeyError, match="lerning_rate"):
        RunConfig.from_flat({"lerning_rate": 1})


@pytest.mark.parametrize("value, entries", [("0, 1", [0, 1]), (3, [3]), ("cpu,cpu", ["cpu", "cpu"]),
                                            ("CPU", ["cpu"]), ("2,,3", [2, 3])])
def test_the_gpu_grammar(value, entries):
    assert gpus.entries(value) == entries


@pytest.mark.parametrize("value", ["0,x", "", "-1", None, True, [0]])
def test_the_gpu_grammar_refuses(value):
    with pytest.raises(ValueError):
        gpus.entries(value)
    assert run_entry_problems("r", {"trainer": {"drafter_gpus": value}})  # the entry check, through the same parser


def test_the_trainers_devices_follow_the_same_grammar():
    assert parse_devices("0, 1", "--drafter-gpus") == ["cuda:0", "cuda:1"] and parse_devices("CPU", "--x") == ["cpu"]
    for bad in ("0,x", "-1", "0,cpu", "1,1"):
        with pytest.raises(ConfigError):
            parse_devices(bad, "--drafter-gpus")

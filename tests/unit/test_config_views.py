"""Settings views (config.settings_view): each module's view of the run configuration names
RunConfig's fields with RunConfig's types, so a renamed or retyped setting fails here, not at a
run's first evaluation."""

import ast
import dataclasses
import importlib
import typing
from pathlib import Path

import pytest
from flashfleet_trainer import config
from flashfleet_trainer.config import FIELDS, RunConfig, settings_view, view

PACKAGE = Path(config.__file__).parent


def declared_views() -> set[tuple[str, str]]:
    """(module, class name) of every class decorated with @settings_view in the trainer package,
    read from the source, so a view in a module no test imports is found too."""
    found = set()
    for f in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(d, "id", getattr(d, "attr", None)) == "settings_view" for d in node.decorator_list):
                found.add((f"flashfleet_trainer.{f.stem}", node.name))
    return found


def all_views() -> list[type]:
    views = [getattr(importlib.import_module(mod), name) for mod, name in sorted(declared_views())]
    assert {(v.__module__, v.__qualname__) for v in config.VIEWS} >= set(declared_views())
    return views


def test_the_leaf_modules_have_views():
    names = {name for _mod, name in declared_views()}
    assert {"EvalSettings", "FeedSettings", "TargetSettings", "VllmSettings"} <= names, names


@pytest.mark.parametrize("cls", all_views(), ids=lambda c: c.__qualname__)
def test_every_view_field_is_a_runconfig_field_of_the_same_type(cls):
    want = {name: f.type for name, f in FIELDS.items()}
    have = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        assert f.name in FIELDS, f"{cls.__qualname__}.{f.name} is not a RunConfig field"
        assert have[f.name] == want[f.name], f"{cls.__qualname__}.{f.name}: {have[f.name]} here, {want[f.name]} in RunConfig"
    assert cls.__dataclass_params__.frozen, f"{cls.__qualname__} must be frozen"


def test_a_view_is_built_from_the_configuration_or_a_larger_view():
    from flashfleet_trainer.feed import FeedSettings
    from flashfleet_trainer.target import TargetSettings

    run = RunConfig.from_flat(dict(target_model="/models/t", target_compile="off", use_soft_labels=True))
    feed = view(FeedSettings, run)
    assert feed == FeedSettings(target_model="/models/t", target_compile="off", use_soft_labels=True,
                                kl_weight=run.kl_weight, ce_target=run.ce_target)
    assert view(TargetSettings, feed) == TargetSettings(target_model="/models/t", target_compile="off")
    with pytest.raises(dataclasses.FrozenInstanceError):
        feed.kl_weight = 0.0


def test_a_view_naming_no_runconfig_field_is_refused_at_declaration():
    with pytest.raises(TypeError, match=r"names eval_temprature, not RunConfig field"):
        @settings_view
        class Misspelt:
            eval_temprature: float


def test_view_refuses_a_class_not_declared_as_a_view():
    @dataclasses.dataclass(frozen=True)
    class Plain:
        seed: int

    with pytest.raises(TypeError, match="declare it with @config.settings_view"):
        view(Plain, RunConfig())

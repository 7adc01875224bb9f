"""The trainer package's two module maps, its __init__ docstring and docs/trainer.md's "Modules
(reading order)" table, each name every module the package has and none it has not."""

import re
from pathlib import Path

import flashfleet_trainer

PACKAGE = Path(flashfleet_trainer.__file__).parent
DOC = Path(__file__).parents[2] / "docs" / "trainer.md"


def modules() -> set[str]:
    return {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}


def init_map(doc: str) -> set[str]:
    """The names that open the map's indented lines (`  config      the command line ...`)."""
    return set(re.findall(r"^  ([a-z_0-9]+)\s", doc.split("Modules, in reading order", 1)[1], re.M))


def docs_table(text: str) -> set[str]:
    """The `name.py` entries of the table's first column."""
    section = text.split("## Modules (reading order)", 1)[1].split("\n## ", 1)[0]
    firsts = [row.split("|")[1] for row in section.splitlines() if row.startswith("| `")]
    return {name for cell in firsts for name in re.findall(r"`([a-z_0-9]+)\.py`", cell)}


def test_the_init_map_names_every_module_and_no_other():
    listed = init_map(flashfleet_trainer.__doc__)
    assert listed == modules(), f"missing: {sorted(modules() - listed)}; gone: {sorted(listed - modules())}"


def test_the_docs_table_names_every_module_and_no_other():
    listed = docs_table(DOC.read_text())
    assert listed == modules(), f"missing: {sorted(modules() - listed)}; gone: {sorted(listed - modules())}"


def test_the_readers_see_a_missing_or_a_gone_module():
    doc = "Modules, in reading order:\n  config      the command line\n  model       gone\nnotes\n"
    assert init_map(doc) == {"config", "model"}
    table = ("## Modules (reading order)\n\n| module | owns |\n|---|---|\n| `cli.py` | see `tiny.py` |\n"
             "| `data_cli.py`, `data_build.py` | dflash-data |\n\n## Known limits\n| `x.py` | no |\n")
    assert docs_table(table) == {"cli", "data_cli", "data_build"}

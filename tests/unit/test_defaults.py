"""defaults.py owns the constants the drafter's and the loss's defaults follow: the modules that
apply them and RunConfig's help texts read them from there, and config.py spells none of them."""

import ast
import re
from pathlib import Path

from flashfleet_trainer import config, defaults
from flashfleet_trainer.config import FIELDS, help_text
from flashfleet_trainer.drafter import default_mask_token_id
from flashfleet_trainer.loss import default_gamma


def test_decay_gamma_by_block_size_is_dflashs():
    assert [default_gamma(b) for b in (2, 8, 9, 10, 15, 16, 32)] == [4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 7.0]


def test_mask_row_is_the_published_drafters_spare_row_else_the_last():
    assert default_mask_token_id(151936) == 151669 and default_mask_token_id(248320) == 248070
    assert default_mask_token_id(1000) == 999


def owned_numbers() -> set[int]:
    """The owner's numbers distinctive enough to find in config.py's source (not 2, 5 or 8)."""
    nums = {n for pair in defaults.SPARE_MASK_ROWS.values() for n in pair} | set(defaults.HYBRID_DRAFTER.values())
    return {n for n in nums if n >= 16}


def config_texts() -> str:
    """Every string literal of config.py's source (f-strings' literal parts too): its texts."""
    tree = ast.parse(Path(config.__file__).read_text())
    return "\n".join(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def test_config_states_them_from_the_owner_and_spells_none():
    texts = config_texts()
    for n in sorted(owned_numbers()):
        spelled = re.search(rf"(?<![\w.,]){n:,}(?![\w])|(?<![\w.,]){n}(?![\w])", texts)
        assert not spelled, f"config.py's texts spell {n}: build the text from defaults.py instead"
    helps = " ".join(help_text(f) for f in FIELDS.values())
    for n in sorted(owned_numbers()):
        assert str(n) in helps or f"{n:,}" in helps, f"RunConfig's help no longer states {n}"
    gamma = help_text(FIELDS["decay_gamma"])
    assert all(f"{g:g} for block >= {b}" in gamma for b, g in defaults.DECAY_GAMMAS[:-1]), gamma
    assert f"{defaults.RANDOM_DRAFTER_LAYERS} unless given" in help_text(FIELDS["num_draft_layers"])

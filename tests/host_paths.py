"""The project's host paths for Python readers (tests): read from their one owner, the run contract
role's defaults (roles/flashfleet_contract/defaults/main.yml), never spelled again here.

    from tests.host_paths import HOST_PATHS
    HOST_PATHS["flashfleet_venv"]    # '/opt/flashfleet/venv' unless the owner moves it
"""

from __future__ import annotations

import yaml

from tests.conftest import ROOT

OWNER = ROOT / "roles/flashfleet_contract/defaults/main.yml"
HOST_PATHS: dict[str, str] = {k: v for k, v in yaml.safe_load(OWNER.read_text()).items()
                              if isinstance(v, str) and v.startswith("/")}

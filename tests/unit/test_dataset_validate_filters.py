"""roles/dataset/filter_plugins/flashfleet_dataset.py: the dataset role's validation reads the staging
module's own rules (flashfleet.stage), so a setting or an S3 URL is judged the same way before any
host is touched and again on the host."""

from __future__ import annotations

import importlib.util

import pytest
from flashfleet import stage

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("flashfleet_dataset", ROOT / "roles/dataset/filter_plugins/flashfleet_dataset.py")
fd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fd)

GOOD = {"concurrency": 16, "retries": 3, "free_margin_ratio": 0.1, "free_margin_bytes": 0}


@pytest.mark.parametrize("src, ok", [
    ("s3://ff-data/tok", True), ("s3://ff-data", True), ("https://example.com/m/", True), ("/srv/data", True),
    ("s3://FF-Data/tok", False), ("s3://ab/x", False), ("s3://" + "a" * 64 + "/x", False), ("data/tok", False),
    ("ftp://x/y", False), ("", False),
])
def test_the_role_and_the_module_take_the_same_s3_urls(src, ok):
    problems = fd.flashfleet_dataset_entry_problems([{"name": "d", "src": src, "files": ["a"]}], [])
    assert (problems == []) == ok, problems
    if src.startswith("s3://"):  # the module's own parse agrees
        try:
            stage.parse_s3_url(src)
            parsed = True
        except ValueError:
            parsed = False
        assert parsed == ok


@pytest.mark.parametrize("change, needle", [
    ({"concurrency": 0}, "concurrency 0 is outside 1-256"), ({"concurrency": 257}, "concurrency 257 is outside 1-256"),
    ({"retries": 0}, "retries 0 is below 1"), ({"free_margin_ratio": 1.0}, "free_margin_ratio 1.0 is outside [0, 1)"),
    ({"free_margin_bytes": -1}, "free_margin_bytes -1 is negative"),
])
def test_a_setting_the_module_refuses_is_refused_by_the_role(change, needle):
    [problem] = fd.flashfleet_dataset_setting_problems({**GOOD, **change})
    assert problem.startswith(needle) and "(fix: set " in problem
    assert stage.setting_problems(**{**GOOD, **change})[0][0] == needle


def test_good_settings_and_every_problem_at_once():
    assert fd.flashfleet_dataset_setting_problems({**GOOD, "concurrency": "8"}) == []
    assert len(fd.flashfleet_dataset_setting_problems({"concurrency": 0, "retries": 0, "free_margin_ratio": 2,
                                                        "free_margin_bytes": -5})) == 4


def test_entry_problems_name_the_entry():
    data = [{"name": "bad name", "src": "/srv/a"}, {"name": "web", "src": "https://h/x"},
            {"name": "m", "src": "/srv/m", "manifest": ["x"]}, {"name": "dup", "src": "/a"}, {"name": "dup", "src": "/b"}]
    assert fd.flashfleet_dataset_entry_problems(data, [{"src": "s3://ff-models/big"}]) == [
        "data bad name: name must be [A-Za-z0-9._-] (a directory name)",
        "data web: an https source cannot be listed; give a manifest or a files list",
        "data m: manifest must be {path: {size, sha256}}",
        "model ?: name must be [A-Za-z0-9._-] (a directory name)",
        "data names are not unique: bad name, web, m, dup, dup",
    ]

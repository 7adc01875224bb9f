"""A run's webhook settings (word at death) are checked before any change: train_unit's
verdict_check (part of its preflight) refuses a URL that is not http(s) and a token that the
verdict unit's EnvironmentFile cannot quote, naming what to fix, and never shows the token."""

from __future__ import annotations

import pytest

from tests.conftest import failure_messages, local_inventory, role_play

TOKEN = "tok-9f2c"


def _play(tmp_path):
    return role_play(tmp_path, "train_unit", "verdict_check"), local_inventory(tmp_path)


@pytest.mark.parametrize("url, token, needle", [
    ("ftp://hooks.example/x", TOKEN, "webhook.url must be an http(s) URL"),
    ("https://", TOKEN, "webhook.url must be an http(s) URL"),
    ("https://hooks.example/x", "it's", "may not hold a quote, a backslash or a line break"),
    ("https://hooks.example/x", "two\nlines", "may not hold a quote, a backslash or a line break"),
])
def test_a_bad_webhook_is_refused_naming_the_fix(tmp_path, run_playbook, url, token, needle):
    playbook, inventory = _play(tmp_path)
    r = run_playbook(playbook, inventory, cmdline="--check", train_unit_run="v2",
                     train_unit_spec={"trainer": {}, "webhook": {"url": url}}, train_unit_webhook_token=token)
    messages = "\n".join(failure_messages(r))
    assert r.rc != 0 and needle in messages and "flashfleet_runs.v2.webhook" in messages, messages
    assert token not in messages


@pytest.mark.parametrize("spec", [{"trainer": {}, "webhook": {"url": "http://127.0.0.1:8765/deaths"}}, {"trainer": {}}])
def test_a_good_webhook_or_none_passes(tmp_path, run_playbook, spec):
    playbook, inventory = _play(tmp_path)
    r = run_playbook(playbook, inventory, cmdline="--check", train_unit_run="v2", train_unit_spec=spec,
                     train_unit_webhook_token=TOKEN)
    assert r.rc == 0, "\n".join(failure_messages(r))

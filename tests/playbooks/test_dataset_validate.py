"""The dataset role's validation, run through Ansible on this machine in check mode: it refuses what
the staging module would refuse (flashfleet.stage's rules), every problem at once, before any host
is touched, and passes good inputs."""

from __future__ import annotations

from tests.conftest import failure_messages, local_inventory, role_play


def _validate(tmp_path, run_playbook, **extravars):
    return run_playbook(role_play(tmp_path, "dataset", "validate"), local_inventory(tmp_path), cmdline="--check",
                        dataset_check_boto3=False, **extravars)


def test_an_s3_url_the_module_would_refuse_is_refused_first(tmp_path, run_playbook):
    r = _validate(tmp_path, run_playbook, dataset_concurrency=0, dataset_retries=0,
                  dataset_data=[{"name": "tok", "src": "s3://FF-Data/tok"}])
    assert r.rc != 0
    messages = "\n".join(failure_messages(r))
    assert "src 's3://FF-Data/tok' is not s3://bucket/prefix" in messages, messages


def test_bad_numeric_settings_name_the_variable_to_set(tmp_path, run_playbook):
    r = _validate(tmp_path, run_playbook, dataset_concurrency=0, dataset_retries=0)
    messages = "\n".join(failure_messages(r))
    assert r.rc != 0
    assert "concurrency 0 is outside 1-256 (fix: set concurrency (dataset_concurrency) to 1-256)" in messages
    assert "retries 0 is below 1" in messages


def test_good_inputs_pass(tmp_path, run_playbook):
    r = _validate(tmp_path, run_playbook, dataset_data=[{"name": "tok", "src": "s3://ff-data/tok"}],
                  dataset_models=[{"name": "tiny", "src": str(tmp_path)}])
    assert r.rc == 0, "\n".join(failure_messages(r))

"""User data: a small bash script that writes the env file and starts the shipped units."""

import subprocess

import pytest

from runtime.userdata import REQUIRED_KEYS, render_env_file, render_user_data

ENV = {
    "FLEETCAST_FLEET": "fleetcast",
    "FLEETCAST_REGION": "ap-northeast-2",
    "FLEETCAST_POOL": "l40s",
    "FLEETCAST_BUCKET": "fleetcast-apne2-111122223333",
    "FLEETCAST_CONFIG_PARAM": "/fleetcast/fleetcast/config",
    "FLEETCAST_CONFIG_DIGEST": "0" * 64,
    "FLEETCAST_IMAGE": "111122223333.dkr.ecr.ap-northeast-2.amazonaws.com/tensorrt-llm@sha256:" + "a" * 64,
    "FLEETCAST_RUNTIME_BUNDLE": "s3://fleetcast-apne2-111122223333/runtime/bundle-abc.zip",
    "FLEETCAST_LOG_GROUP": "/fleetcast/fleetcast/instances",
}


def test_user_data_is_valid_bash_and_never_names_the_asg():
    script = render_user_data(ENV)
    assert script.startswith("#!/bin/bash\n")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "autoscaling:groupName" not in script and "AutoScalingGroup" not in script
    assert "systemctl enable --now" in script
    assert len(script.encode()) < 16384  # EC2 user data limit is 16 KiB


def test_env_file_reads_the_same_in_bash_as_docker_env_file_literal_values():
    env_file = render_env_file(ENV)
    lines = dict(line.split("=", 1) for line in env_file.splitlines())
    assert lines == ENV  # docker --env-file takes values literally
    out = subprocess.run(
        ["bash", "-c", "set -a; source /dev/stdin; env"], input=env_file, text=True, capture_output=True, check=True
    ).stdout
    sourced = dict(line.split("=", 1) for line in out.splitlines() if line.startswith("FLEETCAST_"))
    assert sourced == ENV


def test_cdk_tokens_pass_through_unescaped():
    env = dict(ENV, FLEETCAST_BUCKET="${Token[TOKEN.123]}", FLEETCAST_RUNTIME_BUNDLE="s3://${Token[TOKEN.45]}/runtime/b.zip")
    assert "FLEETCAST_BUCKET=${Token[TOKEN.123]}\n" in render_user_data(env)


@pytest.mark.parametrize("key", REQUIRED_KEYS)
def test_missing_key_is_named(key):
    env = {k: v for k, v in ENV.items() if k != key}
    with pytest.raises(ValueError, match=key):
        render_user_data(env)


@pytest.mark.parametrize("value", ["a b", "x;rm -rf /", "$(id)", "`id`", "a\nb", "'q'"])
def test_shell_special_values_are_refused(value):
    with pytest.raises(ValueError, match="FLEETCAST_POOL"):
        render_user_data(dict(ENV, FLEETCAST_POOL=value))


def test_a_variable_the_contract_does_not_define_is_refused_at_synth():
    """Every name comes from fleetcast/contract/instance_env.py: a misspelt one would be written to the env
    file and silently ignored on the instance."""
    with pytest.raises(ValueError, match="FLEETCAST_POLS_S"):
        render_user_data(dict(ENV, FLEETCAST_POLS_S="5"))

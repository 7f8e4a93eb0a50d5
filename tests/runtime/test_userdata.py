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
    # Read at run time from the instance's own tag (IMDS), never interpolated: that would be a template cycle.
    assert "AutoScalingGroup" not in script
    assert "autoscaling:groupName" not in script.replace("meta-data/tags/instance/aws:autoscaling:groupName", "")
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


IMDS = ('case "$*" in *api/token*) echo tok;; *instance-id*) echo i-0abc123;; '
        '*aws:autoscaling:groupName*) echo fleetcast-ap-northeast-2-l40s;; *) exit 22;; esac')


def run_user_data(tmp_path, aws: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The rendered user data with its host paths under tmp_path and stand-ins for aws, curl, sleep, systemctl."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"aws": aws, "curl": IMDS, "sleep": "exit 0", "systemctl": "exit 0"}.items():
        (bin_dir / name).write_text(f'#!/bin/bash\necho "{name} $*" >> "{tmp_path}/calls.log"\n{body}\n')
        (bin_dir / name).chmod(0o755)
    script = render_user_data(ENV)
    for path in ("/etc/fleetcast", "/var/lib/fleetcast", "/opt/fleetcast", "/etc/systemd/system"):
        script = script.replace(path, f"{tmp_path}{path}")
    result = subprocess.run(["bash", "-c", script], env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True,
                            text=True, timeout=60)
    log = (tmp_path / "calls.log").read_text().splitlines()
    return result, log


ABANDON = ("aws autoscaling complete-lifecycle-action --region ap-northeast-2 --lifecycle-hook-name {hook} "
           "--auto-scaling-group-name fleetcast-ap-northeast-2-l40s --instance-id i-0abc123 "
           "--lifecycle-action-result ABANDON")


def test_a_runtime_bundle_that_is_not_there_abandons_the_launch_at_once(tmp_path):
    """The host completes its own launch hook with ABANDON: the group replaces it now, not after the hook's hour."""
    from fleetcast.contract.telemetry import LAUNCH_HOOK

    missing = ('[ "$1" = s3 ] && { echo "fatal error: An error occurred (404) when calling the HeadObject operation: '
               'Key \"runtime/bundle-abc.zip\" does not exist" >&2; exit 1; }; exit 0')
    result, log = run_user_data(tmp_path, missing)
    assert result.returncode == 1 and "abandoning this launch" in result.stderr
    assert sum(c.startswith("aws s3 cp") for c in log) == 1 and not any(c.startswith("sleep") for c in log)
    assert ABANDON.format(hook=LAUNCH_HOOK) in log
    assert not any(c.startswith("systemctl") for c in log)


def test_a_bundle_download_that_keeps_failing_abandons_after_bounded_retries(tmp_path):
    from fleetcast.contract.telemetry import LAUNCH_HOOK
    from runtime.userdata import DOWNLOAD_ATTEMPTS

    unreachable = ('[ "$1" = s3 ] && { echo "Could not connect to the endpoint URL" >&2; exit 1; }; exit 0')
    result, log = run_user_data(tmp_path, unreachable)
    assert result.returncode == 1
    assert sum(c.startswith("aws s3 cp") for c in log) == DOWNLOAD_ATTEMPTS
    assert log[-1] == ABANDON.format(hook=LAUNCH_HOOK)

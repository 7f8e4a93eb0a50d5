"""`fleetcast traffic export`: bad arguments and missing credentials are one clear line with the documented exit code."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetcast.contract.errors import UserError
from fleetcast.traffic.export import MAX_AGE, MAX_QUERIES, export
from scripts import cli
from tests.gateway.conftest import fleet_config

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def never(*_a, **_k):
    raise AssertionError("no AWS call expected")


@pytest.mark.parametrize("kw,message", [
    ({"region": "eu-west-1"}, "--region 'eu-west-1' is not a provider region"),
    ({"consumer": "nobody"}, "--consumer 'nobody' is not a consumer"),
    ({"hour_stat": "median"}, "--hour-stat 'median'"),
])
def test_unknown_names_are_refused_naming_the_argument(kw, message):
    with pytest.raises(UserError, match=message) as err:
        export(fleet_config(), NOW - timedelta(days=7), NOW, never, now=NOW, **kw)
    assert err.value.exit_code == 2


def test_a_window_older_than_one_minute_data_is_kept_is_refused():
    # GetMetricStatistics / GetMetricData, "Amazon CloudWatch retains metric data as follows": data points
    # with a period of 60 seconds are available for 15 days; the burstiness needs them.
    assert MAX_AGE == timedelta(days=15)
    with pytest.raises(UserError, match="15 days"):
        export(fleet_config(), NOW - timedelta(days=16), NOW, never, now=NOW)


def test_query_batches_stay_inside_the_get_metric_data_limit():
    # GetMetricData API reference: "can retrieve as many as 500 different metrics in a single request".
    assert MAX_QUERIES == 500


def test_without_credentials_the_command_exits_4_naming_what_is_missing(tmp_path, monkeypatch, capsys):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    rc = cli.main(["traffic", "export", "--since", "2h", "--region", "ap-northeast-2", "--out", str(tmp_path / "t.yaml")])
    err = capsys.readouterr().err
    assert rc == 4 and "no AWS credentials" in err and "Traceback" not in err
    assert not (tmp_path / "t.yaml").exists()


def test_a_window_without_requests_says_so():
    def empty(_region, **params):
        return {"MetricDataResults": [{"Id": q["Id"], "Values": [], "Timestamps": []}
                                      for q in params["MetricDataQueries"]]}
    with pytest.raises(UserError, match="no requests metered for fleet fleetcast") as err:
        export(fleet_config(), NOW - timedelta(hours=2), NOW, empty, region="ap-northeast-2", now=NOW)
    assert err.value.exit_code == 1

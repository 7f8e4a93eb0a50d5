"""`fleetcast traffic export --out FILE`: a directory that is not there is said before any CloudWatch query, and
the profile is written whole or not at all."""

from __future__ import annotations

import pytest

from scripts import cli
from scripts.traffic_cmd import write_profile


def test_an_out_directory_that_is_not_there_is_refused_before_any_query(tmp_path, monkeypatch, capsys):
    import scripts.traffic_cmd as traffic_cmd

    def no_query(*_a, **_k):
        raise AssertionError("no CloudWatch call expected")

    monkeypatch.setattr(traffic_cmd, "cloudwatch_caller", lambda _profile: no_query)
    out = tmp_path / "missing" / "t.yaml"
    rc = cli.main(["traffic", "export", "--since", "2h", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == f"fleetcast traffic: --out {out}: directory {out.parent} does not exist"


def test_a_failed_write_leaves_the_old_profile(tmp_path, monkeypatch):
    out = tmp_path / "t.yaml"
    out.write_text("schema: fleetcast.traffic/v1\n")
    doc = {"schema": "fleetcast.traffic/v1", "name": "n", "consumers": [{"region": "ap-northeast-2",
                                                                          "rate_rps": [1.0] * 24}]}

    from ruamel.yaml import YAML

    real_dump = YAML.dump

    def half_then_fail(self, data, stream, *a, **k):
        real_dump(self, data, stream, *a, **k)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(YAML, "dump", half_then_fail)
    with pytest.raises(OSError):
        write_profile(doc, out)
    assert out.read_text() == "schema: fleetcast.traffic/v1\n"

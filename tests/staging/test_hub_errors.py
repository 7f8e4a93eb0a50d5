"""A hub fetch that fails is the operator's to fix (a typo in `source`, a revision that does not exist, a gated
repository without a token, no route to the hub): `fleetcast stage model` and `stage adapter` say so in one
line naming the config field, never with the hub client's traceback. No network: the hub client is a double."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from fleetcast.config import parse_config
from fleetcast.contract.errors import UserError
from fleetcast.staging.adapters import stage_adapter
from fleetcast.staging.model import hub_errors, stage_model

from .test_adapters import ROOT, SEOUL, config_with_adapters


def _refusing_hub(monkeypatch, exc: Exception) -> None:
    import huggingface_hub

    class Api:
        def __init__(self, token=None):
            pass

        def model_info(self, repo_id, revision=None, files_metadata=False):
            raise exc

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.delenv("HF_TOKEN", raising=False)


def _not_found() -> Exception:
    import httpx2  # the HTTP client huggingface_hub 2.x raises its errors with (huggingface_hub/utils/_http.py)
    from huggingface_hub.errors import RepositoryNotFoundError

    url = "https://huggingface.co/api/models/org/x"
    return RepositoryNotFoundError(f"404 Client Error. Repository Not Found for url: {url}",
                                   response=httpx2.Response(404, request=httpx2.Request("GET", url)))


def test_an_adapter_source_the_hub_does_not_know(monkeypatch, clients, make_bucket):
    _refusing_hub(monkeypatch, _not_found())
    with pytest.raises(UserError) as caught:
        stage_adapter(config_with_adapters(), "qwen2.5-3b", "qwen-sql", {SEOUL: make_bucket(SEOUL)}, clients,
                      log=lambda _: None)
    message = str(caught.value)
    assert message.startswith("models[qwen2.5-3b].adapters[qwen-sql].source: fetching org/qwen-sql-lora at "
                              "revision 'v1' from the hub failed: RepositoryNotFoundError: 404 Client Error.")
    assert "\n" not in message


def test_a_model_source_the_hub_does_not_know(monkeypatch, clients, make_bucket):
    _refusing_hub(monkeypatch, _not_found())
    cfg = parse_config(YAML(typ="safe").load((ROOT / "examples" / "multi-model" / "fleet.yaml").read_text()))
    with pytest.raises(UserError, match=r"^models\[gpt2-xl\]\.source: fetching .* from the hub failed: "
                                        r"RepositoryNotFoundError"):
        stage_model(cfg, {SEOUL: make_bucket(SEOUL)}, clients, log=lambda _: None, model_id="gpt2-xl")


def test_no_route_to_the_hub_is_said_too():
    with pytest.raises(UserError, match=r"^models\[m\]\.source: .* failed: ConnectionRefusedError"):
        with hub_errors("models[m].source", "org/m", "main"):
            raise ConnectionRefusedError(111, "Connection refused")


def test_a_fault_of_fleetcast_itself_is_not_dressed_as_the_hubs():
    with pytest.raises(KeyError):
        with hub_errors("models[m].source", "org/m", "main"):
            raise KeyError("siblings")

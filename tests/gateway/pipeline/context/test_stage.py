"""Who turns context management on, and with what budget: config, tenant, key, header."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.config import ContextSettings
from gateway.errors import InvalidRequest
from gateway.pipeline.context.stage import ask
from tests.gateway.pipeline.conftest import parsed


def scope(**headers: str) -> dict:
    return {
        "path": "/v1/chat/completions",
        "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
    }


def test_off_by_default_and_the_header_turns_it_on_with_a_budget():
    cfg = ContextSettings()
    assert not ask(cfg, parsed(), scope()).on
    found = ask(cfg, parsed(), scope(x_gearshift_context="auto", x_gearshift_context_budget="900"))
    assert found.on and found.budget_tokens == 900 and found.fraction == 0.75


def test_key_over_tenant_over_config_and_the_header_over_all():
    cfg = ContextSettings.model_validate(
        {
            "mode": "off",
            "budget_fraction": 0.5,
            "tenants": {"default": {"mode": "auto", "budget_fraction": 0.4}},
            "keys": {"key-1": {"budget_tokens": 1234}},
        }
    )
    found = ask(cfg, parsed(), scope())
    assert found.on and found.fraction == 0.4 and found.budget_tokens == 1234
    assert not ask(cfg, parsed(), scope(x_gearshift_context="off")).on
    other = ask(cfg, parsed(tenant="other"), scope())  # same key, another tenant
    assert not other.on and other.fraction == 0.5 and other.budget_tokens == 1234


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("x_gearshift_context", "summarize-everything"),
        ("x_gearshift_context_budget", "-5"),
        ("x_gearshift_context_budget", "lots"),
        ("x_gearshift_context_budget", "0"),
    ],
)
def test_a_bad_header_is_the_clients_400_naming_it(name, value):
    with pytest.raises(InvalidRequest) as err:
        ask(ContextSettings(), parsed(), scope(**{name: value}))
    assert err.value.param == name.replace("_", "-")


def test_summarizer_and_rungs_per_key_over_the_config():
    cfg = ContextSettings.model_validate(
        {"summarizer": "extractive", "keys": {"key-1": {"summarizer": "full", "rungs": ["drop"]}}}
    )
    mine = ask(cfg, parsed(), scope())
    assert mine.summarizer == "full" and mine.rungs == ("drop",)
    other = parsed()
    other = replace(other, identity=replace(other.identity, api_key="other"))
    plain = ask(cfg, other, scope())
    assert plain.summarizer == "extractive" and plain.rungs == ("mask", "summarize", "drop")


def test_clearing_and_the_masked_outputs_digest_per_key_over_the_config():
    cfg = ContextSettings.model_validate(
        {"keys": {"key-1": {"clear_to_fraction": 1.0, "mask_digest_chars": 0}}}
    )
    mine = ask(cfg, parsed(), scope())
    assert mine.clear_to == 1.0 and mine.digest_chars == 0
    other = parsed()
    other = replace(other, identity=replace(other.identity, api_key="other"))
    plain = ask(cfg, other, scope())
    assert plain.clear_to == 0.5 and plain.digest_chars == 240  # the shipped default

"""The embedded stack's layouts: the routed pair, or two full replicas and no fast tier.

Only the server specs and tiers are built here; nothing starts (the gateway over the
layout's tiers: tests/integration/test_embedded_layout.py)."""

import argparse
import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gateway.cli import embedded, main
from gateway.config import EmbeddedSettings, RouterSettings, load_settings
from router.classifier import DEFAULT_MODEL
from router.types import Tier

MODEL = Path("/m/full")
PRUNED = Path("/m/pruned")


@pytest.fixture
def built(monkeypatch) -> list[str]:
    """Provisioning that returns paths, two CPUs, no family check; what was built, in order."""
    calls: list[str] = []

    def pruned(*args, **kwargs) -> Path:
        calls.append("pruned")
        return PRUNED

    monkeypatch.setattr(embedded, "provision", lambda *a, **k: calls.append("full") or MODEL)
    monkeypatch.setattr(embedded, "provision_pruned", pruned)
    monkeypatch.setattr(embedded.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(embedded, "fingerprint", lambda path, parser: (str(path), parser))
    monkeypatch.setattr(embedded, "check_same_family", lambda prints: calls.append("family"))
    return calls


def test_full_replicas_serve_the_full_model_on_each_core_as_one_tier(built, tmp_path):
    settings = EmbeddedSettings(
        layout="full-replicas", home=tmp_path, full_port=9101, fast_port=9102,
        kv_compaction={"full": {"enabled": True}},
    )  # fmt: skip
    stack = embedded.build_stack(settings)
    assert built == ["full"]  # no pruned model, and one model needs no family check
    servers = {name: m.spec for name, m in stack.supervisor.servers.items()}
    assert list(servers) == ["full", "full-2"]
    first, second = servers["full"], servers["full-2"]
    assert (first.cpu_bind, second.cpu_bind) == ("0", "1")
    assert (first.port, second.port) == (9101, 9102)
    for spec in (first, second):
        assert spec.model_dir == MODEL and spec.speculative is None
        assert spec.served_model_name == embedded.FULL_MODEL_NAME
        assert spec.kv_compaction is not None and spec.kv_compaction.enabled
    assert list(stack.tiers) == [Tier.FULL]
    tier = stack.tiers[Tier.FULL]
    assert tier.model == embedded.FULL_MODEL_NAME
    assert tier.replicas == ["http://127.0.0.1:9101", "http://127.0.0.1:9102"]
    assert tier.tool_call_parser == first.tool_call_parser


def test_the_routed_layout_stays_the_default_pair(built, tmp_path):
    stack = embedded.build_stack(EmbeddedSettings(home=tmp_path))
    assert built == ["full", "pruned", "family"]
    assert list(stack.supervisor.servers) == ["full", "fast"]
    fast = stack.supervisor.servers["fast"].spec
    assert fast.model_dir == PRUNED and fast.cpu_bind == "1"
    assert {t: ts.model for t, ts in stack.tiers.items()} == {
        Tier.FULL: embedded.FULL_MODEL_NAME, Tier.FAST: embedded.FAST_MODEL_NAME,
    }  # fmt: skip


def test_fast_tier_settings_are_refused_in_the_full_replicas_layout():
    with pytest.raises(ValidationError) as err:
        EmbeddedSettings(
            layout="full-replicas", fast_mode="ngram", heal_steps=0,
            kv_compaction={"fast": {"enabled": True}},
        )  # fmt: skip
    assert (
        "embedded.fast_mode, embedded.heal_steps, embedded.kv_compaction.fast: they shape "
        "the fast tier, which embedded.layout 'full-replicas' does not run" in str(err.value)
    )
    with pytest.raises(ValidationError, match="'routed' or 'full-replicas'"):
        EmbeddedSettings(layout="replicas")
    # the shared settings are the layout's own; fast-tier ones at their defaults pass, as in
    # a copy of the annotated example file
    EmbeddedSettings(layout="full-replicas", dtype="float32", fast_port=9000, max_model_len=2048)
    example = Path(__file__).parents[3] / "deploy" / "gearshift.example.yaml"
    config = yaml.safe_load(example.read_text())["embedded"]
    assert EmbeddedSettings(**{**config, "layout": "full-replicas"}).fast_mode == "lossy"


def test_the_layout_is_set_like_every_other_setting(monkeypatch):
    assert load_settings().embedded.layout == "routed"
    monkeypatch.setenv("GEARSHIFT_EMBEDDED__LAYOUT", "full-replicas")
    assert load_settings().embedded.layout == "full-replicas"


@pytest.mark.parametrize(
    ("settings", "needed"),
    [
        ({}, True),
        ({"fast_mode": "lossless"}, True),
        ({"fast_mode": "ngram"}, False),
        ({"fast_mode": "suffix"}, False),
        ({"layout": "full-replicas"}, False),
    ],
)
def test_provision_builds_the_pruned_model_only_where_it_is_served(
    settings, needed, monkeypatch, tmp_path, capsys
):
    import backends.provision

    built: list[str] = []
    monkeypatch.setattr(backends.provision, "provision", lambda *a: built.append("full") or MODEL)
    monkeypatch.setattr(
        backends.provision, "provision_pruned", lambda *a: built.append("pruned") or PRUNED
    )
    config = tmp_path / "gearshift.yaml"
    config.write_text(json.dumps({"embedded": settings}))
    assert embedded.pruned_model_needed(EmbeddedSettings(**settings)) is needed
    assert main.cmd_provision(argparse.Namespace(config=config)) == 0
    assert built == (["full", "pruned"] if needed else ["full"])
    assert capsys.readouterr().out.split() == [str(MODEL), *([str(PRUNED)] if needed else [])]


def test_full_replicas_do_not_warn_about_a_router_trained_on_another_fast_tier(tmp_path):
    spec = json.loads(DEFAULT_MODEL.read_text())
    spec["training"]["fast_tier"] = {"model": "other", "mode": "ngram"}
    own = tmp_path / "own.json"
    own.write_text(json.dumps(spec))
    router = RouterSettings(policy="classifier", params={"model": str(own)})
    assert len(embedded.router_mismatches(router, EmbeddedSettings())) == 1
    assert embedded.router_mismatches(router, EmbeddedSettings(layout="full-replicas")) == []

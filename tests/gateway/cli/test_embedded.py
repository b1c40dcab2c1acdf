"""The embedded stack's fast tier: its server for each mode and speculation knob, and the
warning when the router's models learned from another fast tier."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from backends.provision import ProvisionError
from backends.vllm_server import CompactionConfig, VllmServerSpec, command, compaction_args
from gateway.cli import embedded
from gateway.config import DEFAULT_ROUTER_PARAMS, EmbeddedSettings, RouterSettings
from router.classifier import DEFAULT_MODEL, Classifier
from router.policy import build_policy, parts

FULL = VllmServerSpec(name="full", model_dir=Path("/m/full"), served_model_name="full", port=1)
PRUNED = Path("/m/pruned")


@pytest.fixture(autouse=True)
def _no_pruning(monkeypatch):
    # Building the pruned checkpoint is tested in tests/backends; here only its path matters.
    monkeypatch.setattr(embedded, "provision_pruned", lambda *a, **k: PRUNED)


def fast(**settings) -> VllmServerSpec:
    spec, description = embedded._fast_spec(EmbeddedSettings(**settings), FULL, "1")
    assert settings.get("fast_mode", "lossy") in description
    return spec


def test_lossy_serves_the_pruned_model_with_the_default_ngram_settings():
    spec = fast()
    assert spec.model_dir == PRUNED and spec.cpu_bind == "1"
    assert dict(spec.speculative or {}) == {
        "method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
    }  # fmt: skip
    assert (fast(fast_mode="ngram").speculative or {})["num_speculative_tokens"] == 4


@pytest.mark.parametrize("mode", ["lossy", "ngram"])
def test_ngram_knobs_reach_the_server_command(mode):
    spec = fast(fast_mode=mode, speculative_tokens=8, ngram_min=1, ngram_max=3)
    assert spec.model_dir == (PRUNED if mode == "lossy" else FULL.model_dir)
    argv = command(spec, Path("python"))
    config = argv[argv.index("--speculative-config") + 1]
    assert config == (
        '{"method":"ngram","num_speculative_tokens":8,"prompt_lookup_max":3,"prompt_lookup_min":1}'
    )


def test_lossless_drafts_with_the_pruned_model():
    assert dict(fast(fast_mode="lossless").speculative or {}) == {
        "method": "draft_model", "model": str(PRUNED), "num_speculative_tokens": 3,
    }  # fmt: skip
    spec = fast(fast_mode="lossless", speculative_tokens=5)
    assert spec.model_dir == FULL.model_dir
    assert (spec.speculative or {})["num_speculative_tokens"] == 5


def test_suffix_serves_the_full_model_with_suffix_decoding(monkeypatch):
    checked = []
    monkeypatch.setattr(embedded, "require_module", lambda *a: checked.append(a[1]))
    spec = fast(fast_mode="suffix")
    assert spec.model_dir == FULL.model_dir and checked == ["arctic_inference"]
    assert dict(spec.speculative or {}) == {"method": "suffix", "num_speculative_tokens": 16}
    assert (fast(fast_mode="suffix", speculative_tokens=8).speculative or {})[
        "num_speculative_tokens"
    ] == 8
    # vLLM runs model-free proposers with its synchronous scheduler; so must the plugin's
    spec = replace(spec, kv_compaction=CompactionConfig(enabled=True))
    assert compaction_args(spec)[1] == "kvplugin.scheduler.CompactingScheduler"


def test_suffix_without_arctic_inference_says_how_to_install_it():
    # this environment (the gateway's) has no arctic_inference: the check runs for real
    with pytest.raises(ProvisionError, match=r"scripts/install\.sh --with-suffix"):
        embedded._fast_spec(
            EmbeddedSettings(fast_mode="suffix", vllm_python=Path(sys.executable)), FULL, "1"
        )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ngram_min": 5, "ngram_max": 3}, "ngram_min (5) must not exceed embedded.ngram_max (3)"),
        ({"speculative_tokens": 0}, "greater than or equal to 1"),
        ({"speculative_tokens": 17}, "less than or equal to 16"),
    ],
)
def test_bad_speculation_settings_are_refused(settings, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EmbeddedSettings(**settings)


# The router's models learn where one particular fast tier falls short.


def test_the_shipped_router_models_belong_to_the_default_fast_tier():
    default = embedded.fast_tier_identity(EmbeddedSettings())
    models = [
        p
        for p in parts(build_policy("session", DEFAULT_ROUTER_PARAMS))
        if isinstance(p, Classifier)
    ]
    assert {Path(m.source).name for m in models} == {"classifier.json", "classifier-sampled.json"}
    assert all(m.fast_tier == default for m in models)  # retrain both after changing a default
    assert embedded.router_mismatches(RouterSettings(), EmbeddedSettings()) == []


def test_serving_another_fast_tier_warns_once_per_model():
    warnings = embedded.router_mismatches(RouterSettings(), EmbeddedSettings(prune_remove=2))
    assert len(warnings) == 2
    assert all("prune_remove=4; this one has prune_remove=2" in w for w in warnings)
    assert all("retrain (docs/fast-tier.md)" in w for w in warnings)
    ngram = embedded.router_mismatches(RouterSettings(), EmbeddedSettings(fast_mode="ngram"))
    assert "mode=lossy, prune_method=block-influence" in ngram[0]
    # one file scoring both regimes, under rules and budget, warns once
    both = RouterSettings(policy="rules", params={"base": "budget", "base_params": {
        "model": str(DEFAULT_MODEL), "sampled_model": str(DEFAULT_MODEL)}})  # fmt: skip
    assert len(embedded.router_mismatches(both, EmbeddedSettings(heal_steps=0))) == 1


def test_models_without_a_recorded_tier_and_bad_policies_do_not_warn(tmp_path):
    spec = json.loads(DEFAULT_MODEL.read_text())
    del spec["training"]["fast_tier"]
    own = tmp_path / "own.json"
    own.write_text(json.dumps(spec))
    settings = RouterSettings(policy="classifier", params={"model": str(own)})
    assert embedded.router_mismatches(settings, EmbeddedSettings(prune_remove=2)) == []
    broken = RouterSettings(policy="classifier", params={"threshold": 7})
    assert embedded.router_mismatches(broken, EmbeddedSettings(prune_remove=2)) == []


def test_self_written_healing_data_is_part_of_the_tier_and_its_cache_key():
    from backends.provision import PruneOptions

    calibration = EmbeddedSettings(heal_data="calibration", heal_steps=100)
    warnings = embedded.router_mismatches(RouterSettings(), calibration)
    assert len(warnings) == 2
    assert (
        "with heal_data=self, heal_samples=256, heal_steps=400; "
        "this one has heal_data=calibration, heal_steps=100:" in warnings[0]
    )
    # calibration-healed checkpoints keep the pruning arguments (and cache keys) they had
    assert "--heal-data" not in PruneOptions(4, "block-influence", 100).args()
    assert PruneOptions(4, heal_steps=100, heal_data="self", heal_samples=64).args()[-4:] == [
        "--heal-data", "self", "--heal-samples", "64"]  # fmt: skip
    # without healing steps nothing is written or distilled, whatever heal_data says
    unhealed = PruneOptions(4, heal_steps=0, heal_data="self")
    assert not unhealed.self_written and "--heal-data" not in unhealed.args()
    assert "heal_data" not in embedded.fast_tier_identity(EmbeddedSettings(heal_steps=0))
    with pytest.raises(ValidationError, match="greater than or equal to 4"):
        EmbeddedSettings(heal_samples=2)

"""parse_params: a policy's configuration checked against its parameter dataclass."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import pytest

from router import PolicyError, available_policies, build_policy, parse_params
from router.policies.always import AlwaysParams
from router.policies.budget import BudgetParams
from router.policies.classifier import ClassifierParams
from router.policies.length_threshold import LengthThresholdParams
from router.policies.load_aware import LoadAwareParams
from router.policies.rules import RulesParams
from router.policies.session import SessionParams
from router.policy import NonNegativeInt, PositiveFloat, PositiveInt, Probability


@dataclass(frozen=True, slots=True)
class Knobs:
    size: int  # required
    share: Probability = 0.5
    scale: PositiveFloat = 1.0
    count: NonNegativeInt = 0
    batch: PositiveInt | None = None
    flag: bool = False
    mode: Literal["greedy", "sampled"] = "greedy"
    level: Literal[1, 2] = 1
    name: str = "x"
    extra: Mapping[str, object] = field(default_factory=dict)
    weights: Mapping[str, float] = field(default_factory=dict)
    ids: tuple[int, ...] = ()
    names: list[str] = field(default_factory=list)
    pair: tuple[str, int] = ("a", 1)
    anything: Sequence[object] = ()
    raw: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.count > self.size:
            raise PolicyError("count cannot exceed size")


def parse(**params: object) -> Knobs:
    return parse_params(Knobs, {"size": 3, **params}, "knobs")


def test_defaults_and_given_values():
    k = parse(share=1, mode="sampled", extra={"a": [1]}, ids=[1, 2], names=("a",), pair=["b", 2])
    assert k == Knobs(3, share=1.0, mode="sampled", extra={"a": [1]}, ids=(1, 2), names=["a"],
                      pair=("b", 2))  # fmt: skip
    assert isinstance(k.share, float) and isinstance(k.ids, tuple) and isinstance(k.names, list)
    assert parse_params(Knobs, {"size": 0}, "knobs") == Knobs(0)
    assert parse(raw={"a": {"b": None}}, anything=[1, "x"]).raw == {"a": {"b": None}}


def test_the_dataclass_is_not_given_the_callers_mapping():
    extra = {"a": 1}
    assert parse(extra=extra).extra is not extra  # a copy: the caller's later edits stay out


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"colour": 1, "bogus": 2},
            r"knobs: unknown parameters \['bogus', 'colour'\]; known: size, share, scale",
        ),
        ({"size": True}, r"knobs: size must be an integer, got True"),
        ({"size": 2.0}, r"knobs: size must be an integer, got 2.0"),
        ({"share": True}, r"knobs: share must be a number between 0 and 1, got True"),
        ({"share": 1.5}, r"knobs: share must be a number between 0 and 1, got 1.5"),
        ({"share": "0.5"}, r"knobs: share must be a number between 0 and 1, got '0.5'"),
        ({"share": float("nan")}, r"share must be a number between 0 and 1, got nan"),
        ({"scale": 0}, r"knobs: scale must be a positive number, got 0"),
        ({"count": -1}, r"knobs: count must be a non-negative integer, got -1"),
        ({"batch": 0}, r"knobs: batch must be a positive integer or null, got 0"),
        ({"flag": 1}, r"knobs: flag must be true or false, got 1"),
        ({"flag": "yes"}, r"knobs: flag must be true or false, got 'yes'"),
        ({"mode": "beam"}, r"knobs: mode must be one of 'greedy', 'sampled', got 'beam'"),
        ({"level": True}, r"knobs: level must be one of 1, 2, got True"),
        ({"name": None}, r"knobs: name must be a string, got None"),
        ({"extra": [1]}, r"knobs: extra must be a mapping \(keys: a string\), got \[1\]"),
        ({"extra": {1: 2}}, r"knobs: extra must be a mapping \(keys: a string\), got \{1: 2\}"),
        (
            {"weights": {"a": "b"}},
            r"weights must be a mapping \(keys: a string; values: a number\)",
        ),
        ({"ids": "12"}, r"knobs: ids must be a list \(items: an integer\), got '12'"),
        ({"ids": [1, False]}, r"knobs: ids must be a list \(items: an integer\), got \[1, False\]"),
        ({"pair": ["a"]}, r"knobs: pair must be a list of 2 \(a string, an integer\)"),
        ({"count": 4}, r"^knobs: count cannot exceed size$"),
    ],
)
def test_each_mistake_names_the_policy_the_field_and_what_it_must_be(params, message):
    with pytest.raises(PolicyError, match=message):
        parse(**params)


def test_a_required_field_and_a_mapping_are_asked_for():
    with pytest.raises(PolicyError, match=r"^knobs: size is required \(an integer\)$"):
        parse_params(Knobs, {}, "knobs")
    with pytest.raises(PolicyError, match=r"knobs: parameters must be a mapping, got \[1\]"):
        parse_params(Knobs, [1], "knobs")  # type: ignore[arg-type]


def test_long_values_are_cut_in_messages():
    with pytest.raises(PolicyError) as info:
        parse(name=["x" * 1000])
    assert len(str(info.value)) < 150 and str(info.value).endswith("...")


def test_a_policy_without_parameters_says_so():
    assert parse_params(AlwaysParams, {}, "always_full") == AlwaysParams()
    with pytest.raises(PolicyError, match=r"^always_full: takes no parameters, got \['x'\]$"):
        parse_params(AlwaysParams, {"x": 1}, "always_full")


def test_a_type_it_cannot_check_is_a_bug_not_a_configuration_error():
    @dataclass(frozen=True)
    class Odd:
        when: set[int] = field(default_factory=set)

    with pytest.raises(TypeError, match="cannot check"):
        parse_params(Odd, {"when": [1]}, "odd")


PARAMS = {
    "always_full": AlwaysParams,
    "always_fast": AlwaysParams,
    "length_threshold": LengthThresholdParams,
    "classifier": ClassifierParams,
    "budget": BudgetParams,
    "load_aware": LoadAwareParams,
    "rules": RulesParams,
    "session": SessionParams,
}


def test_every_registered_policy_declares_its_parameters():
    assert set(PARAMS) == set(available_policies())


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_unknown_parameters_list_every_known_one(name):
    with pytest.raises(PolicyError) as info:
        build_policy(name, {"bogus": 1})
    message = str(info.value)
    assert message.startswith(f"{name}: ")
    assert all(f.name in message for f in fields(PARAMS[name]))


def test_combined_parameters_list_the_classifiers_and_their_own():
    with pytest.raises(
        PolicyError, match=r"known: model, threshold, .*, fast_share, window, min_samples$"
    ):
        build_policy("budget", {"colour": 1})


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        (
            "length_threshold",
            {"threshold_tokens": True},
            "length_threshold: threshold_tokens must be a non-negative integer, got True",
        ),
        ("classifier", {"model": 3}, "classifier: model must be a string or null, got 3"),
        ("classifier", {"threshold": None, "explore": 0.6}, "classifier: explore above 0.5"),
        ("load_aware", {"shift": 2}, "load_aware: shift must be a number between 0 and 1, got 2"),
        ("budget", {"min_samples": 0}, "budget: min_samples must be a positive integer, got 0"),
        (
            "rules",
            {"base_params": [1]},
            r"rules: base_params must be a mapping \(keys: a string\) or null",
        ),
        ("rules", {"base": 3}, "rules: base must be a string, got 3"),
        (
            "session",
            {"base": "rules", "base_params": {"code": "yes"}},
            "rules: code must be true or false",
        ),
    ],
)
def test_built_in_policies_name_the_field(name, params, message):
    with pytest.raises(PolicyError, match=message):
        build_policy(name, params)


def test_null_nested_parameters_mean_the_defaults():
    plain = build_policy("session", {"base": "rules", "base_params": None})
    assert type(plain.base).__name__ == "Rules"  # type: ignore[attr-defined]
    rules = build_policy("rules", {"risk": None, "base_params": None})
    assert rules.risk == {}  # type: ignore[attr-defined]


def test_rule_switches_keep_their_order():
    p = parse_params(RulesParams, {"math": False, "code": True}, "rules")
    assert p.enabled == ("tool_call", "code", "effort", "tool_error")
    off = parse_params(RulesParams, {"code": False, "math": False, "effort": False, "tool_call": False}, "rules")  # fmt: skip
    assert off.enabled == ("tool_error",)

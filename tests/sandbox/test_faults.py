"""Fault injection: seeded draws, and the result each kind of fault stands in for."""

from __future__ import annotations

from typing import get_args

import pytest

from sandbox.faults import FAULTS, Faults
from sandbox.protocol import FaultKind, FaultPlan, FaultRule, ToolResult

VERDICT = ToolResult(tool="run_python", allowed=True, rule="tenant:acme", reason="granted",
                     risk="destructive")  # fmt: skip
GRANTED = {"tool": "run_python", "allowed": True, "rule": "tenant:acme", "reason": "granted",
           "risk": "destructive"}  # fmt: skip


def test_every_fault_kind_has_an_outcome():
    assert set(FAULTS) == set(get_args(FaultKind))


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("timeout", ToolResult(**GRANTED, fault="timeout", exit_status=137, limit="wall_time",
                               stderr="killed: wall time limit")),
        ("rate_limit", ToolResult(**GRANTED, fault="rate_limit", retry_after_s=2.5,
                                  stderr="rate limited; retry later")),
        ("exception", ToolResult(**GRANTED, fault="exception", exit_status=1,
                                 stderr="RuntimeError: the tool failed unexpectedly")),
        ("permission", ToolResult(**{**GRANTED, "allowed": False, "reason": "permission denied"},
                                  fault="permission")),
        ("exhaustion", ToolResult(**GRANTED, fault="exhaustion", exit_status=137, limit="memory",
                                  stderr="killed: out of memory")),
    ],
)  # fmt: skip
def test_each_fault_stands_in_for_its_result(kind: FaultKind, expected: ToolResult):
    got = FAULTS[kind].apply(VERDICT, kind, 2.5)
    assert got.model_dump() == expected.model_dump()
    assert got.model_dump_json() == expected.model_dump_json()  # what the attestation covers
    assert VERDICT.fault is None  # the verdict itself is left as it was


def test_the_script_comes_first_then_the_seeded_rules():
    plan = FaultPlan(seed=3, script=["timeout", None],
                     rules=[FaultRule(kind="exception", probability=0.5)])  # fmt: skip
    a, b = Faults(plan), Faults(plan)
    draws = [a.next() for _ in range(40)]
    assert draws[:2] == ["timeout", None]
    assert set(draws[2:]) == {"exception", None}
    assert draws == [b.next() for _ in range(40)]  # seeded: the same plan, the same faults


def test_no_plan_no_faults_and_the_default_retry_delay():
    faults = Faults(None)
    assert faults.next() is None and faults.retry_after_s == 1.0
    assert Faults(FaultPlan(retry_after_s=7)).retry_after_s == 7

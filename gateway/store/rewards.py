"""Process-reward components, each a named number stored as its own row.

Components (name: value, scope):

- ``tool_call_valid``: +1 when every tool call of a step parses and matches the
  offered schema, -1 otherwise (step).
- ``truncated``: -1 when the answer stopped on ``max_tokens`` (step).
- ``failed``: -1 when the step ended in an error (step).
- ``completion_tokens``: minus the completion tokens in thousands: resource use (step).
- ``repeated_tool_call``: -1 for a call identical (tool and arguments) to an
  earlier one in the session (tool_call).
- ``tool_success``: +1 / -1 from the tool's outcome (tool_call); the sandbox's
  attested exit status when there is one, else the result text.
- ``tool_seconds``: minus the tool's duration in seconds, when known (tool_call).
- ``api_correctness``: F1 of the session's tool calls against the expected
  actions of its task specification (session, computed when the session ends).
- ``user_feedback``: the score of each feedback (session or step).
- hook components: any ``module:function`` listed in ``rewards.hooks`` is called
  with each step's view and returns more components (``plan_consistency`` and
  the like belong there, next to the agent that knows its plan format).

The combined reward is computed when exporting: the sum of components times
``rewards.weights`` (unlisted components weigh 0), so weights can change
without rewriting history.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gateway.store.chain import canonical_args

Hook = Callable[[Mapping[str, Any]], Mapping[str, float]]

DEFAULT_WEIGHTS: dict[str, float] = {
    "tool_call_valid": 0.2,
    "truncated": 0.2,
    "failed": 0.5,
    "repeated_tool_call": 0.2,
    "tool_success": 0.3,
    "api_correctness": 1.0,
    "user_feedback": 1.0,
    "outcome": 1.0,
}

ERROR_MARKERS = ("error", "traceback (most recent call last)", "exception:", "permission denied")


def step_components(
    *,
    status: int,
    finish_reason: str | None,
    completion_tokens: int | None,
    call_checks: list[str | None],
) -> dict[str, float]:
    out: dict[str, float] = {}
    if call_checks:
        out["tool_call_valid"] = 1.0 if all(c is None for c in call_checks) else -1.0
    if finish_reason == "length":
        out["truncated"] = -1.0
    if status != 200:
        out["failed"] = -1.0
    if completion_tokens:
        out["completion_tokens"] = -completion_tokens / 1000.0
    return out


def tool_outcome_from_text(result: str) -> bool:
    """Best effort when no sandbox attested the call: does the result read as a failure?"""
    head = result.lstrip()[:200].lower()
    return not any(head.startswith(m) or f'"{m}"' in head for m in ERROR_MARKERS)


def sandbox_outcome(outcome: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """What a sandbox run sets on the tool call it answers (``tool_calls`` columns), and the
    rewards it earns (``tool_success``, ``tool_seconds``)."""
    allowed = bool(outcome.get("allowed"))
    if not allowed:
        status = "denied"
    elif outcome.get("limit") == "wall_time" or outcome.get("fault") == "timeout":
        status = "timeout"  # killed by its wall-time limit (or a fault that plays one)
    else:
        status = "ok" if outcome.get("exit_status") == 0 else "error"
    values = {
        "result": outcome.get("text"), "status": status, "exit_status": outcome.get("exit_status"),
        "duration_ms": outcome.get("duration_ms"), "denial": None if allowed else outcome.get("reason"),
        "injected_fault": outcome.get("fault"), "attestation": outcome.get("attestation"),
    }  # fmt: skip
    earned = {"tool_success": 1.0 if status == "ok" else -1.0}
    if outcome.get("duration_ms"):
        earned["tool_seconds"] = -float(outcome["duration_ms"]) / 1000
    return values, earned


def call_signature(tool: str, arguments: str) -> str:
    return f"{tool}\x00{canonical_args(arguments)}"


def api_correctness(
    expected: Iterable[Mapping[str, Any]], made: Iterable[tuple[str, str]]
) -> float:
    """F1 between expected actions ({name, arguments}) and the calls made (tool, arguments).

    An expected action matches a call with the same name whose arguments include
    every expected argument with an equal value (extra arguments are tolerated,
    as BFCL's checker does for optional parameters). Each call matches once.
    """
    want = [(str(e.get("name")), e.get("arguments") or {}) for e in expected]
    calls = [(name, _loads(args)) for name, args in made]
    if not want and not calls:
        return 1.0
    used: set[int] = set()
    hits = 0
    for name, args in want:
        for i, (cname, cargs) in enumerate(calls):
            if i in used or cname != name or not isinstance(cargs, dict):
                continue
            if all(cargs.get(k) == v for k, v in args.items()):
                used.add(i)
                hits += 1
                break
    if hits == 0:
        return 0.0
    precision, recall = hits / len(calls), hits / len(want)
    return 2 * precision * recall / (precision + recall)


def _loads(arguments: str) -> Any:
    import orjson

    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return None


def combined(components: Iterable[tuple[str, float]], weights: Mapping[str, float]) -> float:
    return sum(weights.get(name, 0.0) * value for name, value in components)


def load_hooks(specs: Iterable[str]) -> list[tuple[str, Hook]]:
    """Import ``module:function`` hooks; a bad spec fails at start-up with its name."""
    hooks = []
    for spec in specs:
        module, _, attr = spec.partition(":")
        if not module or not attr:
            raise ValueError(f"reward hook {spec!r} must look like 'package.module:function'")
        fn = getattr(importlib.import_module(module), attr, None)
        if not callable(fn):
            raise ValueError(f"reward hook {spec!r}: {attr!r} is not a function of {module!r}")
        hooks.append((spec, fn))
    return hooks

"""The default router's threshold knob, and what it would do at other values, without asking again.

The default chain (``session`` over ``rules`` over ``classifier``; gateway/config.py) sends a
step to the full tier when a rule fires, else when the classifier's P(needs full) is at or
above its threshold (0.476, stored in the model). ``router_params(threshold)`` is that chain
with another classifier threshold: what ``GEARSHIFT_ROUTER__PARAMS`` takes, so a stack can
be started at an operating point.

``decisions(bodies)`` runs the same chain in this process on the requests the benchmark
sends (each a fresh session, as the benchmark's requests are): per request, whether a rule
decided or the classifier did, and the classifier's score. ``sweep`` then says, for each
candidate threshold, which tier every task would go to, and from the always-full and
always-fast scores of the same tasks, the mix's quality against always-full and its
fast-tier share. Greedy answers are deterministic per tier, so a routed answer is the
tier's answer; what the replay leaves out is the gateway's escalation of a failed fast
answer to the full tier (which can only raise the routed quality) and the gateway's
prompt-token estimate refitted to the tiers' tokenizer (``router.calibrate_tokens``), which
can move a score near the threshold: ``agreement`` compares the replayed decisions with the
ones the gateway took.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.tier_quality import Pairs, retention
from gateway.config import RouterSettings
from router import RouteRequest, Tier, build_policy


def router_params(threshold: float | None = None) -> tuple[str, dict[str, Any]]:
    """The default policy and its params, with the classifier's threshold set (None: its own)."""
    settings = RouterSettings()
    params = copy.deepcopy(settings.params)
    if threshold is not None:
        node: dict[str, Any] = params
        while node.get("base") not in (None, "classifier"):
            node = node.setdefault("base_params", {})
        if node.get("base") != "classifier":
            raise ValueError("the default router chain has no classifier to set a threshold on")
        node.setdefault("base_params", {})["threshold"] = threshold
    return settings.policy, params


@dataclass(frozen=True)
class Routed:
    tier: str  # what the chain decided at its own threshold
    by_classifier: bool  # False: a rule (or the session) decided, whatever the threshold
    score: float | None
    threshold: float | None


def decisions(bodies: Mapping[str, Mapping[str, Any]], threshold: float | None = None) -> dict[str, Routed]:  # fmt: skip
    """Per task id, the default chain's decision on its request body."""
    name, params = router_params(threshold)
    policy = build_policy(name, params)
    out = {}
    for task_id, body in bodies.items():
        d = policy.decide(RouteRequest("chat", body))
        by_classifier = d.policy.endswith("classifier") and d.score is not None
        out[task_id] = Routed(str(d.tier), by_classifier, d.score, d.threshold)
    return out


def tier_at(routed: Routed, threshold: float) -> str:
    if not routed.by_classifier or routed.score is None:
        return routed.tier
    return str(Tier.FULL if routed.score >= threshold else Tier.FAST)


def sweep(
    routed: Mapping[str, Routed],
    full: Mapping[str, float],
    fast: Mapping[str, float],
    sources: Mapping[str, str],
    thresholds: Sequence[float],
    boot: int = 2000,
) -> list[dict[str, Any]]:
    """Per threshold: the replayed mix's ``quality_vs_full`` (with its interval) and
    ``fast_share``, over the tasks both always-arms answered."""
    ids = [i for i in routed if i in full and i in fast]
    out = []
    for t in thresholds:
        tiers = {i: tier_at(routed[i], t) for i in ids}
        pairs: Pairs = [(sources[i], full[i], fast[i] if tiers[i] == "fast" else full[i]) for i in ids]  # fmt: skip
        q = retention(pairs, boot)
        share = sum(1 for i in ids if tiers[i] == "fast") / len(ids) if ids else None
        out.append({"threshold": t, "quality_vs_full": q["quality_retention"],
                    "quality_vs_full_ci": q["ci"], "fast_share": share, "tasks": len(ids)})  # fmt: skip
    return out


def operating_point(rows: Sequence[Mapping[str, Any]], keep: float = 0.95) -> float | None:
    """The threshold that sends the most steps to the fast tier while keeping ``keep`` of
    always-full's quality (None: none does)."""
    ok = [r for r in rows if r["quality_vs_full"] is not None and r["quality_vs_full"] >= keep]
    if not ok:
        return None
    return float(max(ok, key=lambda r: (r["fast_share"], r["threshold"]))["threshold"])


def agreement(replayed: Mapping[str, Routed], served: Mapping[str, str]) -> float | None:
    """The share of tasks on which the gateway's router decided as the replay did."""
    ids = [i for i in served if i in replayed]
    return round(sum(replayed[i].tier == served[i] for i in ids) / len(ids), 3) if ids else None

"""Token-level exports for RL: verl agent-loop parquet and OpenRLHF JSONL.

Both need one token sequence per episode with the model's tokens marked
trainable and everything the environment inserted (tool output, user turns,
template tokens between turns) masked. Each run of a session
(``Trajectory.runs``: cut where its history was rewritten, e.g. condensed) is
concatenated only when each step's prompt ids begin with the previous step's
prompt and completion ids exactly as vLLM produced them; otherwise (several
samples, or a chat template that re-tokenizes the previous answer differently)
every step of the run is its own row. Nothing is ever re-tokenized.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway.export.load import Step, Trajectory


@dataclass(slots=True)
class Episode:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: list[tuple[int, int, str, str]] = field(default_factory=list)  # start, end, tier, step
    steps: list[Step] = field(default_factory=list)

    def add_env(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def add_model(self, step: Step) -> None:
        assert step.completion_ids is not None and step.logprobs is not None
        start = len(self.response_ids)
        self.response_ids += step.completion_ids
        self.mask += [1] * len(step.completion_ids)
        self.logprobs += step.logprobs
        self.spans.append((start, len(self.response_ids), step.tier or "", step.id))
        self.steps.append(step)


def _usable(s: Step) -> bool:
    return s.has_tokens and len(s.logprobs or ()) == len(s.completion_ids or ())


def episodes(t: Trajectory) -> Iterator[Episode]:
    for run in t.runs():
        steps = [s for s in run if _usable(s)]
        if steps and _extends(steps):
            yield _joined(steps)
            continue
        for s in steps:
            ep = Episode(list(s.prompt_ids or ()))
            ep.add_model(s)
            yield ep


def _joined(steps: list[Step]) -> Episode:
    ep = Episode(list(steps[0].prompt_ids or ()))
    seen = list(ep.prompt_ids)
    for s in steps:
        ep.add_env((s.prompt_ids or [])[len(seen) :])
        ep.add_model(s)
        seen = [*(s.prompt_ids or ()), *(s.completion_ids or ())]
    return ep


def _extends(steps: list[Step]) -> bool:
    for prev, cur in itertools.pairwise(steps):
        seen = [*(prev.prompt_ids or ()), *(prev.completion_ids or ())]
        if (cur.prompt_ids or [])[: len(seen)] != seen:
            return False
    return True


def verl(t: Trajectory) -> Iterator[dict[str, Any]]:
    for ep in episodes(t):
        yield {
            "uid": t.group,
            "session_id": t.session["id"],
            "prompt_ids": ep.prompt_ids,
            "response_ids": ep.response_ids,
            "response_mask": ep.mask,
            "response_logprobs": ep.logprobs,
            "reward_score": t.reward,
            "turn_scores": [s.reward for s in ep.steps],
            "tool_rewards": [r["value"] for r in t.rewards if r["scope"] == "tool_call"],
            "tier_spans": [
                {"start": a, "end": b, "tier": tier, "step_id": sid} for a, b, tier, sid in ep.spans
            ],
        }


def openrlhf(t: Trajectory) -> Iterator[dict[str, Any]]:
    for ep in episodes(t):
        offset = len(ep.prompt_ids)
        yield {
            "uid": t.group,
            "session_id": t.session["id"],
            "observation_tokens": ep.prompt_ids + ep.response_ids,
            "action_ranges": [[offset + a, offset + b] for a, b, _, _ in ep.spans],
            "rollout_log_probs": [lp for lp, m in zip(ep.logprobs, ep.mask, strict=True) if m],
            "reward": t.reward,
            "tier_spans": [
                {"start": offset + a, "end": offset + b, "tier": tier, "step_id": sid}
                for a, b, tier, sid in ep.spans
            ],
        }

"""A condensation of a session's context, as the writer stores it.

The context stage (``gateway.pipeline.context``) condenses a step's prompt and hands the
recorder what it did with the step (``StepRecord.context``). The writer turns that into:

* the summary's model calls, each a step of the session before the condensed one
  (``policy`` ``context-summary``: an RL export can tell them from the agent's own
  steps), with the token ids the summarizing tier saw and wrote;
* one ``context_events`` row: what was masked, summarized or dropped, the tokens before
  and after, who wrote the summary and which step that was.

The condensed step itself stores the messages the model saw (``gateway.pipeline.record``).
"""

from __future__ import annotations

from typing import Any

from gateway.recording.capture import choices_of
from gateway.recording.records import ChoiceCapture, StepRecord
from gateway.store.rows import now_utc
from gateway.store.schema import SUMMARY_POLICY


def summary_steps(rec: StepRecord) -> list[StepRecord]:
    """The summary's model calls of ``rec``'s condensation, as step records of its session."""
    if rec.context is None:
        return []
    reason = f"context summary for step {rec.step_ids[0]}"
    return [
        call_record(
            call,
            rec.tenant,
            rec.api_key,
            rec.request_id,
            rec.external_session,
            reason,
            task_id=rec.task_id,
            group_id=rec.group_id,
        )
        for call in rec.context.get("summary_steps") or ()
    ]


def call_record(
    call: dict[str, Any], tenant: str, api_key: str, request_id: str, session: str | None,
    reason: str, *, task_id: str | None = None, group_id: str | None = None,
) -> StepRecord:  # fmt: skip
    """A summary's model call (``Applied.event``'s ``summary_steps`` entry) as a step."""
    answer: dict[str, Any] = call["answer"]
    found = answer.get("usage")
    usage: dict[str, Any] = found if isinstance(found, dict) else {}
    ids = answer.get("prompt_token_ids")
    model = answer.get("model")
    return StepRecord(
        step_ids=[call["id"]], request_id=request_id, tenant=tenant, api_key=api_key,
        endpoint="chat", request={**call["request"], "model": model},
        external_session=session, task_id=task_id, group_id=group_id,
        created_at=call["created_at"], status=200, tier=call["tier"],
        model=model if isinstance(model, str) else None, replica=call["replica"],
        policy=SUMMARY_POLICY, propensity=1.0, route_reason=reason, attempts=1,
        prompt_token_ids=ids if isinstance(ids, list) else None,
        choices=choices_of(answer, "chat") or [ChoiceCapture(0)],
        prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
        duration_ms=call["duration_ms"],
    )  # fmt: skip


def event_row(rec: StepRecord, session_id: str, summary_step: str | None) -> dict[str, Any]:
    """The ``context_events`` row of ``rec``'s condensation (``rec.context`` is set)."""
    c = rec.context
    assert c is not None
    return {
        "tenant_id": rec.tenant, "session_id": session_id, "step_id": rec.step_ids[0],
        "api": c["api"], "masked": c["masked"], "clipped": c["clipped"],
        "summarized": c["summarized"], "dropped": c["dropped"],
        "tokens_before": c["tokens_before"], "tokens_after": c["tokens_after"],
        "exact": c["exact"], "summarizer": c["summarizer"], "summary": c.get("summary"),
        "summary_step_id": rec.step_ids[0] if c["api"] == "compact" else summary_step,
        "created_at": now_utc(rec.created_at),
    }  # fmt: skip

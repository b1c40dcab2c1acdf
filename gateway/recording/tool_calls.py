"""The writer's tool calls: a call's row, the results that answer it, and the calls each
session has made.

A call is answered either by a tool message of a later request of its session (paired
here with the call it names) or by the sandbox run that executed it (``ToolResultRecord``).
Either answer finds the call pending in the batch or, failing that, committed. What a
session has called before, by signature, is remembered so that a repeated call is
rewarded without a query, and so are the call ids that no open call of a session has (its
answered calls, and ids found open nowhere), so that the results an agent resends with every
step are looked up once, not at every step. The writer drops a session's entries when another
writer has added steps to it (``gateway.recording.numbering``).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from gateway.recording.batch import (
    CALL_BY_ID,
    CALL_SIGS,
    LRU,
    NO_SANDBOX_RESULT,
    OPEN_CALLS,
    Pending,
    open_calls,
    reward_row,
    text_of,
)
from gateway.recording.records import StepRecord, ToolResultRecord
from gateway.store import rewards
from gateway.store.rows import now_utc, session_key
from sandbox.toolschema import check_call

# under the writer's name: one logger for all that the writer reports
log = logging.getLogger("gateway.recording.writer")

PREFETCH_IDS = (
    500  # (session, call id) pairs a batch's one lookup asks for; past them, step by step
)


def tool_results(messages: Any) -> dict[Any, Any]:
    """The results a request's tool messages carry, by the call id they answer."""
    return {
        m.get("tool_call_id"): m.get("content")
        for m in messages or ()
        if isinstance(m, dict) and m.get("role") == "tool" and m.get("tool_call_id")
    }


class ToolCalls:
    """Builds tool-call rows and applies answers to them; caches, per session, the
    signatures of its calls (``rewards.call_signature``)."""

    def __init__(self, cache: int) -> None:
        self._made = LRU(cache)  # session id -> signatures of its tool calls
        # session id -> call ids no call of it is open under (a new call reopens its id)
        self._settled = LRU(cache)
        # session id -> the ids of every call it made, for a session whose every step was
        # this writer's: a result answering another id has no call in the store to look up
        self._own = LRU(cache)

    def clear(self) -> None:
        self._made.clear()
        self._settled.clear()
        self._own.clear()

    def forget(self, sid: str) -> None:
        """Read session ``sid``'s calls again from the store when next needed."""
        self._made.pop(sid, None)
        self._settled.pop(sid, None)
        self._own.pop(sid, None)

    def new_session(self, sid: str) -> None:
        """Session ``sid`` has no step anywhere and its first is this writer's: it has made
        no call yet, and every call it makes is known here (until ``forget``)."""
        self._made.put(sid, set())
        self._settled.put(sid, set())
        self._own.put(sid, set())

    def row(
        self,
        conn: Connection,
        p: Pending,
        rec: StepRecord,
        step_id: str,
        sid: str,
        call: dict[str, Any],
        schemas: dict[str, dict[str, Any]],
        created: datetime,
    ) -> dict[str, Any]:
        """The row of ``call``, made by step ``step_id``; its ``_problem`` (the arguments
        against the tool's schema) and ``_repeated`` are for the step's rewards and are
        popped before the insert."""
        fn = call.get("function") or {}
        name, args = str(fn.get("name") or ""), str(fn.get("arguments") or "")
        problem = check_call(name, args, schemas) if schemas else None
        made = self._session_calls(conn, p, sid)
        sig = rewards.call_signature(name, args)
        repeated = sig in made
        made.add(sig)
        return {
            "id": uuid.uuid4().hex,
            "tenant_id": rec.tenant,
            "session_id": sid,
            "step_id": step_id,
            "call_id": call.get("id"),
            "tool": name,
            "arguments": args,
            "arguments_valid": problem is None,
            "status": "pending",
            # set in place when a sandbox run or a later step of this batch answers it
            "result": None,
            "result_step_id": None,
            **NO_SANDBOX_RESULT,
            "created_at": created,
            "_problem": problem,
            "_repeated": repeated,
        }

    def add(self, p: Pending, rows: list[dict[str, Any]]) -> None:
        """Put a step's call rows in the batch (after its results: a request's results
        answer earlier calls); a new call opens its id again."""
        p.add_calls(rows)
        for row in rows:
            settled = self._settled.get(row["session_id"])
            if settled is not None:
                settled.discard(row["call_id"])
            own = self._own.get(row["session_id"])
            if own is not None:
                own.add(row["call_id"])

    def results(
        self,
        conn: Connection,
        p: Pending,
        rec: StepRecord,
        sid: str,
        step_id: str,
        messages: Any,
        created: datetime,
    ) -> list[dict[str, Any]]:
        """Pair tool messages in this request with the open calls they answer: this batch's
        in memory, then committed ones (unless the session had nothing committed, the call
        id is settled: looked up or answered before, or no call of a session whose every
        step this writer wrote has that id)."""
        results = p.tool_results.pop(id(messages), None)
        if results is None:
            results = tool_results(messages)
        if not results:
            return []
        # (the call's row when it is pending in this batch, else its id; exit status; result)
        found: list[tuple[dict[str, Any] | str, int | None, str]] = []
        mine = p.open_calls.get(sid, {})
        settled = self._settled.get(sid)
        if settled is None:
            settled = set()
            self._settled.put(sid, settled)
        for call_id in list(results):
            row = mine.pop(call_id, None)
            if row is not None:
                found.append((row, None, text_of(results.pop(call_id))))
                settled.add(call_id)
            elif call_id in settled:
                del results[call_id]
        settled.update(results)  # answered below, or open nowhere
        own = self._own.get(sid)
        ask = list(results) if own is None else [c for c in results if c in own]
        if ask and sid not in p.fresh:
            for call_pk, call_id, exit_status in self._open(conn, p, sid, ask):
                if call_pk not in p.answered:
                    p.answered.add(call_pk)
                    found.append((call_pk, exit_status, text_of(results[call_id])))
        out = []
        for call, exit_status, text in found:
            ok = (
                exit_status == 0
                if exit_status is not None
                else rewards.tool_outcome_from_text(text)
            )
            answer = {"result": text, "result_step_id": step_id, "status": "ok" if ok else "error"}
            if isinstance(call, dict):
                call.update(answer)
                call_pk = call["id"]
            else:
                call_pk = call
                p.answers.append(
                    {
                        "pk": call,
                        "answer": text,
                        "answer_step": step_id,
                        "answer_status": answer["status"],
                    }
                )
            out.append(
                reward_row(rec, sid, None, call_pk, "tool_success", 1.0 if ok else -1.0, created)
            )
        return out

    def prefetch(self, conn: Connection, p: Pending, asks: list[tuple[str, Any]]) -> None:
        """Read in one statement the open committed calls that the steps of a batch may
        pair their tool messages with (``asks``: each step's session id and ``messages``),
        instead of one statement a step (``results``: a session's step at every batch).
        Only what a step would ask is read: the call ids of its tool messages that are not
        settled (and, for a session whose every step was this writer's, that it made).
        Nothing the batch does reaches the store before its flush, so these rows are what
        each step's own statement would read; a step asking anything else reads it then."""
        wanted: dict[str, set[str]] = {}
        for sid, messages in asks:
            results = tool_results(messages)
            p.tool_results[id(messages)] = results
            settled = self._settled.get(sid) or ()
            own = self._own.get(sid)
            ids = {c for c in results if c not in settled and (own is None or c in own)}
            if ids:
                wanted.setdefault(sid, set()).update(ids)
        pairs = sorted((sid, c) for sid, ids in wanted.items() for c in ids)
        if not pairs or len(pairs) > PREFETCH_IDS:
            return
        found: dict[str, list[tuple[str, str, int | None]]] = {sid: [] for sid in wanted}
        for sid, call_pk, call_id, exit_status in open_calls(conn, pairs):
            found[sid].append((call_pk, call_id, exit_status))
        for sid, ids in wanted.items():
            p.prefetched[sid] = (ids, found[sid])

    def _open(
        self, conn: Connection, p: Pending, sid: str, ask: list[Any]
    ) -> list[tuple[str, str, int | None]]:
        """Session ``sid``'s open committed calls under the call ids ``ask``: from the
        batch's ``prefetch`` when it read them all, else read now."""
        known = p.prefetched.get(sid)
        if known is not None and known[0].issuperset(ask):
            wanted = set(ask)
            return [row for row in known[1] if row[1] in wanted]
        return [tuple(r) for r in conn.execute(OPEN_CALLS, {"sid": sid, "call_ids": ask})]

    def sandbox_result(self, conn: Connection, p: Pending, rec: ToolResultRecord) -> None:
        """Set a sandbox run's outcome on the call it answers (pending in this batch, or
        committed) with its rewards. Applied once: a batch resent after a crash finds the
        committed call carrying the same attestation."""
        sid = session_key(rec.tenant, rec.session)
        values, earned = rewards.sandbox_outcome(rec.outcome)
        row = next(
            (
                c
                for c in reversed(p.calls)
                if c["session_id"] == sid and c["call_id"] == rec.call_id
            ),
            None,
        )
        if row is not None:
            row.update(values)
            p.open_calls.get(sid, {}).pop(rec.call_id, None)  # answered: no step pairs it again
            call_pk = row["id"]
        else:
            found = conn.execute(CALL_BY_ID, {"sid": sid, "call": rec.call_id}).first()
            if found is None:
                log.warning("tool result for unknown call %r of session %r", rec.call_id, sid)
                return
            call_pk, attestation = found
            if call_pk in p.answered or (attestation and attestation == values["attestation"]):
                return
            p.answered.add(call_pk)
            p.sandbox_results.append({"pk": call_pk} | {"set_" + k: v for k, v in values.items()})
        created = now_utc(rec.created_at)
        p.rewards += [
            reward_row(rec, sid, None, call_pk, name, value, created, source="sandbox")
            for name, value in earned.items()
        ]

    def _session_calls(self, conn: Connection, p: Pending, sid: str) -> set[str]:
        made = self._made.get(sid)
        if made is None:
            rows = [*conn.execute(CALL_SIGS, {"sid": sid})]
            rows += [(c["tool"], c["arguments"]) for c in p.calls if c["session_id"] == sid]
            made = {rewards.call_signature(t, a) for t, a in rows}
            self._made.put(sid, made)
        return made

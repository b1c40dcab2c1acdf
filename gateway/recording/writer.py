"""Turn step records into rows, on the recorder's thread, one transaction a batch.

Here, not on the request path, live the expensive parts: hashing histories,
finding the session a step continues, numbering steps, pairing tool results
with the calls that asked for them, and computing reward components.

Several writers (one per gateway replica) may write the steps of one session. A step's
number is therefore given at the commit, after the session's last committed step
(``Pending.number``), never from what this process remembers; and what it remembers of
a session (its tool calls) is checked once a batch against the session's last number in
the store, and read again when another writer has added steps since.

Rows are collected per table and inserted with one multi-row statement per
table (``gateway.recording.batch.Pending``); the few reads the writer needs (the
session a history continues, a session's next number, earlier tool calls) are
answered from caches of what this process wrote and from the batch's own pending
rows, and go to the database only on a miss, without writing the batch first. A
batch of agent steps therefore costs a handful of statements, not several per
step: one of them reads the last step number of every session the batch touches.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Connection

from gateway.recording import context_event
from gateway.recording.batch import (
    CALL_BY_ID,
    CALL_SIGS,
    CONTINUED,
    LRU,
    NO_SANDBOX_RESULT,
    OPEN_CALLS,
    TOP_SEQ,
    Pending,
    last_numbers,
    reward_row,
    session_row,
    text_of,
)
from gateway.recording.prompt_ref import Encoded, Lasts, encode
from gateway.recording.records import ChoiceCapture, RawJson, StepRecord, ToolResultRecord
from gateway.store import chain, codec, rewards
from gateway.store.rows import insert_ignore, now_utc, session_key
from gateway.store.schema import tenants
from sandbox.toolschema import check_call, tool_schemas

log = logging.getLogger(__name__)


class StepWriter:
    """Writes records; keeps caches (tenants, chains, last step numbers, tool calls) across
    batches."""

    def __init__(
        self,
        hooks: list[tuple[str, rewards.Hook]] | None = None,
        cache: int = 100_000,
        prompt_cache_mb: float = 64.0,
    ):
        self.hooks = hooks or []
        self._cache = cache
        self._tenants: set[str] = set()
        self._chains = LRU(cache)  # (tenant, continuation hash) -> session id
        # session id -> its last step number known here (-1: none): what the caches below
        # are up to date with
        self._top = LRU(cache)
        self._calls = LRU(cache // 10)  # session id -> signatures of its tool calls
        # session id -> its last step's prompt ids, which the next one's refer to
        self._lasts = Lasts(int(prompt_cache_mb * 2**20))
        self._pending = Pending()

    def forget_caches(self) -> None:
        """After a rolled-back batch the caches may name rows that were never committed."""
        self._tenants.clear()
        self._chains.clear()
        self._top.clear()
        self._calls.clear()
        self._lasts.clear()
        self._pending = Pending()

    def write(self, conn: Connection, records: Sequence[StepRecord | ToolResultRecord]) -> None:
        """Write ``records`` in ``conn``'s transaction. Reads never need what is pending:
        the caches hold every chain link and tool call this batch adds, so the batch is
        one INSERT per table however many lookups it made."""
        self._check_known(conn, records)
        for rec in records:
            if isinstance(rec, ToolResultRecord):
                self._sandbox_result(conn, rec)
            else:
                self._write_one(conn, rec)
        p = self._pending
        for sid, top in p.flush(conn).items():
            if top != p.tops.get(sid, top):  # another writer committed a step meanwhile
                self._calls.pop(sid, None)
            self._top.put(sid, top + p.order[sid])
        self._pending = Pending()

    def _write_one(self, conn: Connection, rec: StepRecord) -> None:
        self._ensure_tenant(conn, rec.tenant)
        request = _parsed(rec.request)
        body = orjson.dumps(request, option=orjson.OPT_SORT_KEYS)
        sha = hashlib.sha256(body).hexdigest()
        self._pending.blobs[sha] = {"sha256": sha, "body": body}
        messages = request.get("messages") if rec.endpoint == "chat" else None
        # The request path's chain hashes when it sent them (one per choice), else our own.
        hashed, history, prefix = rec.chain, None, None
        if hashed is not None and len(hashed.continuations) == len(rec.step_ids):
            prefix = hashed.prefix
        else:
            hashed = None
            if isinstance(messages, list):
                history = chain.History(messages)
                prefix = history.prefix()
        sid, rewritten = self._session(conn, rec, prefix)
        if rec.context is not None:  # a condensed prompt: its summary steps, then the event
            self._condensation(conn, rec, sid)
        seq = self._take_seq(conn, sid)
        created = now_utc(rec.created_at)
        schemas = tool_schemas(request.get("tools"))
        prompt, last = encode(self._lasts.get(sid), rec.prompt_token_ids, self._lasts.budget > 0)
        step_rows, reward_rows, call_rows = [], [], []
        choices = rec.choices or [ChoiceCapture(0)]
        for i, (step_id, choice) in enumerate(zip(rec.step_ids, choices, strict=False)):
            if hashed is not None:
                cont = hashed.continuations[i]
            else:
                cont = history.continuation(choice.message) if history is not None else None
            if cont is not None:
                self._chains.put(f"{rec.tenant}\x00{cont}", sid)
            step_rows.append(self._step_row(rec, step_id, choice, sid, seq, sha, prompt, created))
            step_rows[-1].update(
                rewritten=rewritten, prefix_sha256=prefix, continuation_sha256=cont
            )
            checks = []
            for call in (choice.message or {}).get("tool_calls") or ():
                row = self._call_row(conn, rec, step_id, sid, call, schemas, created)
                checks.append(row.pop("_problem"))
                if row.pop("_repeated"):
                    reward_rows.append(
                        reward_row(
                            rec, sid, step_id, row["id"], "repeated_tool_call", -1.0, created
                        )
                    )
                call_rows.append(row)
            comps = rewards.step_components(
                status=rec.status,
                finish_reason=choice.finish_reason,
                completion_tokens=len(choice.token_ids)
                if choice.token_ids is not None
                else rec.completion_tokens,
                call_checks=checks,
            )
            comps.update(self._hooks(rec, request, choice))
            reward_rows += [
                reward_row(rec, sid, step_id, None, n, v, created) for n, v in comps.items()
            ]
        if last is not None:  # the next step of this session refers to this one's ids
            last.choices = [(i, c.token_ids) for i, c in zip(rec.step_ids, choices, strict=False)]
            self._lasts.put(sid, last)
        # The results this request carries answer earlier calls, not this step's own.
        reward_rows += self._tool_results(conn, rec, sid, rec.step_ids[0], messages, created)
        p = self._pending
        p.steps.extend(step_rows)
        p.add_calls(call_rows)
        p.rewards.extend(reward_rows)

    # -- pieces ------------------------------------------------------------

    def _condensation(self, conn: Connection, rec: StepRecord, sid: str) -> None:
        asides = [self._aside(conn, s, sid) for s in context_event.summary_steps(rec)]
        event = context_event.event_row(rec, sid, asides[-1] if asides else None)
        self._pending.events.append(event)

    def _aside(self, conn: Connection, rec: StepRecord, sid: str) -> str:
        """A step of session ``sid`` that is not the agent's own (a summary's model call):
        outside the session's chain of histories."""
        request = _parsed(rec.request)
        body = orjson.dumps(request, option=orjson.OPT_SORT_KEYS)
        sha = hashlib.sha256(body).hexdigest()
        self._pending.blobs[sha] = {"sha256": sha, "body": body}
        seq = self._take_seq(conn, sid)
        prompt, _ = encode(None, rec.prompt_token_ids)  # whole: the agent's steps refer on
        row = self._step_row(rec, rec.step_ids[0], rec.choices[0], sid, seq, sha, prompt,
                             now_utc(rec.created_at))  # fmt: skip
        row.update(rewritten=False, prefix_sha256=None, continuation_sha256=None)
        self._pending.steps.append(row)
        return rec.step_ids[0]

    def _ensure_tenant(self, conn: Connection, tenant: str) -> None:
        if tenant not in self._tenants:
            insert_ignore(conn, tenants, [{"id": tenant, "created_at": now_utc()}])
            self._tenants.add(tenant)

    def _session(self, conn: Connection, rec: StepRecord, prefix: str | None) -> tuple[str, bool]:
        """The session this step belongs to, and whether its history was rewritten."""
        if rec.external_session is not None:
            sid = session_key(rec.tenant, rec.external_session)
            self._pending.sessions.setdefault(sid, session_row(rec, sid))
            if not self._has_steps(conn, sid):
                return sid, False  # the session's first step: nothing to rewrite
            # Later steps must extend an earlier answer of this session; anything else
            # (a summary, a truncated or edited history) is a rewrite.
            return sid, prefix is None or self._continues(conn, rec.tenant, prefix) != sid
        found = self._continues(conn, rec.tenant, prefix) if prefix else None
        if found is not None:
            return found, False
        sid = uuid.uuid4().hex  # a new session: nothing to look up for it later
        self._pending.sessions[sid] = session_row(rec, sid)
        self._pending.tops[sid] = -1
        self._top.put(sid, -1)
        self._calls.put(sid, set())
        return sid, False

    def _continues(self, conn: Connection, tenant: str, prefix: str) -> str | None:
        hit = self._chains.get(f"{tenant}\x00{prefix}")
        if hit is not None:
            return str(hit)
        row = conn.execute(CONTINUED, {"tenant": tenant, "prefix": prefix}).first()
        return None if row is None else str(row[0])

    def _take_seq(self, conn: Connection, sid: str) -> int:
        """The step's place among this batch's steps of ``sid`` (its number is given at
        the commit: ``Pending.number``)."""
        if not self._has_steps(conn, sid):
            self._pending.fresh.add(sid)
        return self._pending.take(sid)

    def _has_steps(self, conn: Connection, sid: str) -> bool:
        """Whether session ``sid`` has a step, committed or in this batch."""
        p = self._pending
        if sid not in p.tops:
            top = conn.execute(TOP_SEQ, {"sid": sid}).scalar()
            self._known(sid, -1 if top is None else int(top))
        return p.tops[sid] >= 0 or sid in p.order

    def _check_known(
        self, conn: Connection, records: Sequence[StepRecord | ToolResultRecord]
    ) -> None:
        """Read, in one statement, the last step number of the sessions this batch's steps
        name (or continue, by a chain link cached here) and that this writer remembers."""
        sids = set()
        for rec in records:
            if not isinstance(rec, StepRecord):
                continue
            if rec.external_session is not None:
                sids.add(session_key(rec.tenant, rec.external_session))
            elif rec.chain is not None and rec.chain.prefix:
                sid = self._chains.get(f"{rec.tenant}\x00{rec.chain.prefix}")
                if sid is not None:
                    sids.add(str(sid))
        known = sorted(s for s in sids if s in self._top)
        for sid, top in last_numbers(conn, known).items() if known else ():
            self._known(sid, top)

    def _known(self, sid: str, top: int) -> None:
        """Session ``sid``'s last committed step number is ``top``: what is remembered of
        it from before is forgotten when another writer has added steps since."""
        if self._top.get(sid) != top:
            self._calls.pop(sid, None)
            self._top.put(sid, top)
        self._pending.tops[sid] = top

    def _step_row(
        self,
        rec: StepRecord,
        step_id: str,
        choice: ChoiceCapture,
        sid: str,
        seq: int,
        sha: str,
        prompt: Encoded,
        created: datetime,
    ) -> dict[str, Any]:
        return {
            "id": step_id,
            "tenant_id": rec.tenant,
            "session_id": sid,
            "seq": seq,
            "choice_index": choice.index,
            "request_id": rec.request_id,
            "endpoint": rec.endpoint,
            "request_sha256": sha,
            "response": choice.message,
            "prompt_token_ids": prompt.ids,
            "prompt_ref_step": prompt.ref,
            "prompt_ref_len": prompt.shared,
            "completion_token_ids": codec.pack_ids(choice.token_ids),
            "logprobs": codec.pack_floats(choice.logprobs)
            if choice.token_ids is not None
            else None,
            "tier": rec.tier,
            "model": rec.model,
            "replica": rec.replica,
            "policy": rec.policy,
            "routing_version": rec.routing_version,
            "propensity": rec.propensity,
            "route_reason": rec.route_reason,
            "features": rec.features,
            "fallback": rec.fallback,
            "escalated": rec.escalated,
            "attempts": rec.attempts,
            "status": rec.status,
            "finish_reason": choice.finish_reason,
            "prompt_tokens": rec.prompt_tokens,
            "completion_tokens": len(choice.token_ids)
            if choice.token_ids is not None
            else rec.completion_tokens,
            "ttft_ms": rec.ttft_ms,
            "duration_ms": rec.duration_ms,
            "error": rec.error,
            "created_at": created,
        }

    def _call_row(
        self,
        conn: Connection,
        rec: StepRecord,
        step_id: str,
        sid: str,
        call: dict[str, Any],
        schemas: dict[str, dict[str, Any]],
        created: datetime,
    ) -> dict[str, Any]:
        fn = call.get("function") or {}
        name, args = str(fn.get("name") or ""), str(fn.get("arguments") or "")
        problem = check_call(name, args, schemas) if schemas else None
        made = self._session_calls(conn, sid)
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

    def _tool_results(
        self,
        conn: Connection,
        rec: StepRecord,
        sid: str,
        step_id: str,
        messages: Any,
        created: datetime,
    ) -> list[dict[str, Any]]:
        """Pair tool messages in this request with the open calls they answer: this batch's
        in memory, then committed ones (unless the session had nothing committed)."""
        results: dict[Any, Any] = {
            m.get("tool_call_id"): m.get("content")
            for m in messages or ()
            if isinstance(m, dict) and m.get("role") == "tool" and m.get("tool_call_id")
        }
        if not results:
            return []
        p = self._pending
        # (the call's row when it is pending in this batch, else its id; exit status; result)
        found: list[tuple[dict[str, Any] | str, int | None, str]] = []
        mine = p.open_calls.get(sid, {})
        for call_id in list(results):
            row = mine.pop(call_id, None)
            if row is not None:
                found.append((row, None, text_of(results.pop(call_id))))
        if results and sid not in p.fresh:
            params = {"sid": sid, "call_ids": list(results)}
            for call_pk, call_id, exit_status in conn.execute(OPEN_CALLS, params):
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

    def _sandbox_result(self, conn: Connection, rec: ToolResultRecord) -> None:
        """Set a sandbox run's outcome on the call it answers (pending in this batch, or
        committed) with its rewards. Applied once: a batch resent after a crash finds the
        committed call carrying the same attestation."""
        sid = session_key(rec.tenant, rec.session)
        values, earned = rewards.sandbox_outcome(rec.outcome)
        p = self._pending
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

    def _session_calls(self, conn: Connection, sid: str) -> set[str]:
        made = self._calls.get(sid)
        if made is None:
            rows = [*conn.execute(CALL_SIGS, {"sid": sid})]
            rows += [
                (c["tool"], c["arguments"]) for c in self._pending.calls if c["session_id"] == sid
            ]
            made = {rewards.call_signature(t, a) for t, a in rows}
            self._calls.put(sid, made)
        return made

    def _hooks(
        self, rec: StepRecord, request: dict[str, Any], choice: ChoiceCapture
    ) -> dict[str, float]:
        out: dict[str, float] = {}
        if not self.hooks:
            return out
        view = {
            "request": request,
            "answer": choice.message,
            "tier": rec.tier,
            "status": rec.status,
        }
        for spec, hook in self.hooks:
            try:
                out.update({str(k): float(v) for k, v in hook(view).items()})
            except Exception:  # a user's hook must not lose the step
                log.exception("reward hook %s failed on request %s", spec, rec.request_id)
        return out


def _parsed(value: Any) -> Any:
    """A record's value; one kept as raw JSON (records built in this process) parsed."""
    return value.parsed() if isinstance(value, RawJson) else value

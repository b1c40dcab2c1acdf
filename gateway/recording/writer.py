"""Turn step records into rows, on the recorder's thread, one transaction a batch.

Here, not on the request path, live the expensive parts: hashing histories,
finding the session a step continues, numbering steps, pairing tool results
with the calls that asked for them, and computing reward components.

Rows are collected per table and inserted with one multi-row statement per
table (``_Pending``); the few reads the writer needs (a session's next number,
earlier tool calls) are answered from caches of what this process wrote, and go
to the database only on a miss, after flushing what is pending so that they see
it. A batch of agent steps therefore costs a handful of statements, not several
per step.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections import OrderedDict
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Connection, func, insert, select, update

from gateway.recording.records import ChoiceCapture, StepRecord
from gateway.store import chain, codec, rewards
from gateway.store.rows import insert_ignore, now_utc, session_key
from gateway.store.schema import blobs, sessions, steps, tenants, tool_calls
from gateway.store.schema import rewards as rewards_t
from sandbox.toolschema import check_call, tool_schemas

log = logging.getLogger(__name__)


class _LRU(OrderedDict[str, Any]):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def put(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.capacity:
            self.popitem(last=False)


class _Pending:
    """Rows waiting for their multi-row INSERT, in foreign-key order."""

    def __init__(self) -> None:
        self.blobs: dict[str, dict[str, Any]] = {}
        self.sessions: dict[str, dict[str, Any]] = {}
        self.steps: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []
        self.rewards: list[dict[str, Any]] = []

    def flush(self, conn: Connection) -> None:
        insert_ignore(conn, blobs, list(self.blobs.values()))
        insert_ignore(conn, sessions, list(self.sessions.values()))
        for table, rows in (
            (steps, self.steps),
            (tool_calls, self.calls),
            (rewards_t, self.rewards),
        ):
            if rows:
                conn.execute(insert(table), rows)
        self.blobs, self.sessions = {}, {}
        self.steps, self.calls, self.rewards = [], [], []


class StepWriter:
    """Writes records; keeps caches (tenants, chains, next seq, tool calls) across batches."""

    def __init__(self, hooks: list[tuple[str, rewards.Hook]] | None = None, cache: int = 100_000):
        self.hooks = hooks or []
        self._cache = cache
        self._tenants: set[str] = set()
        self._chains = _LRU(cache)  # (tenant, continuation hash) -> session id
        self._seq = _LRU(cache)  # session id -> next seq
        self._calls = _LRU(cache // 10)  # session id -> signatures of its tool calls
        self._pending = _Pending()

    def forget_caches(self) -> None:
        """After a rolled-back batch the caches may name rows that were never committed."""
        self._tenants.clear()
        self._chains.clear()
        self._seq.clear()
        self._calls.clear()
        self._pending = _Pending()

    def write(self, conn: Connection, records: list[StepRecord]) -> None:
        for rec in records:
            self._write_one(conn, rec)
        self._pending.flush(conn)

    def _query(self, conn: Connection, stmt: Any) -> Any:
        """A statement that must see the rows still pending in this batch."""
        self._pending.flush(conn)
        return conn.execute(stmt)

    def _write_one(self, conn: Connection, rec: StepRecord) -> None:
        self._ensure_tenant(conn, rec.tenant)
        body = orjson.dumps(rec.request, option=orjson.OPT_SORT_KEYS)
        sha = hashlib.sha256(body).hexdigest()
        self._pending.blobs[sha] = {"sha256": sha, "body": body}
        messages = rec.request.get("messages") if rec.endpoint == "chat" else None
        history = chain.History(messages) if isinstance(messages, list) else None
        prefix = history.prefix() if history is not None else None
        sid, rewritten = self._session(conn, rec, prefix)
        seq = self._next_seq(conn, sid)
        created = now_utc(rec.created_at)
        schemas = tool_schemas(rec.request.get("tools"))
        step_rows, reward_rows, call_rows = [], [], []
        for step_id, choice in zip(rec.step_ids, rec.choices or [ChoiceCapture(0)], strict=False):
            cont = history.continuation(choice.message) if history is not None else None
            if cont is not None:
                self._chains.put(f"{rec.tenant}\x00{cont}", sid)
            step_rows.append(self._step_row(rec, step_id, choice, sid, seq, sha, created))
            step_rows[-1].update(
                rewritten=rewritten, prefix_sha256=prefix, continuation_sha256=cont
            )
            checks = []
            for call in (choice.message or {}).get("tool_calls") or ():
                row = self._call_row(conn, rec, step_id, sid, call, schemas, created)
                checks.append(row.pop("_problem"))
                if row.pop("_repeated"):
                    reward_rows.append(
                        _reward(rec, sid, step_id, row["id"], "repeated_tool_call", -1.0, created)
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
            comps.update(self._hooks(rec, choice))
            reward_rows += [
                _reward(rec, sid, step_id, None, n, v, created) for n, v in comps.items()
            ]
        # Pairing tool results may flush what is pending: do it before adding this step's rows.
        reward_rows += self._tool_results(conn, rec, sid, rec.step_ids[0], messages, created)
        p = self._pending
        p.steps.extend(step_rows)
        p.calls.extend(call_rows)
        p.rewards.extend(reward_rows)

    # -- pieces ------------------------------------------------------------

    def _ensure_tenant(self, conn: Connection, tenant: str) -> None:
        if tenant not in self._tenants:
            insert_ignore(conn, tenants, [{"id": tenant, "created_at": now_utc()}])
            self._tenants.add(tenant)

    def _session(self, conn: Connection, rec: StepRecord, prefix: str | None) -> tuple[str, bool]:
        """The session this step belongs to, and whether its history was rewritten."""
        if rec.external_session is not None:
            sid = session_key(rec.tenant, rec.external_session)
            self._pending.sessions.setdefault(sid, session_row(rec, sid))
            if self._next_seq(conn, sid, peek=True) == 0:
                return sid, False  # the session's first step: nothing to rewrite
            # Later steps must extend an earlier answer of this session; anything else
            # (a summary, a truncated or edited history) is a rewrite.
            return sid, prefix is None or self._continues(conn, rec.tenant, prefix) != sid
        found = self._continues(conn, rec.tenant, prefix) if prefix else None
        if found is not None:
            return found, False
        sid = uuid.uuid4().hex  # a new session: nothing to look up for it later
        self._pending.sessions[sid] = session_row(rec, sid)
        self._seq.put(sid, 0)
        self._calls.put(sid, set())
        return sid, False

    def _continues(self, conn: Connection, tenant: str, prefix: str) -> str | None:
        hit = self._chains.get(f"{tenant}\x00{prefix}")
        if hit is not None:
            return str(hit)
        row = self._query(
            conn,
            select(steps.c.session_id)
            .where(steps.c.tenant_id == tenant, steps.c.continuation_sha256 == prefix)
            .limit(1),
        ).first()
        return None if row is None else str(row[0])

    def _next_seq(self, conn: Connection, sid: str, peek: bool = False) -> int:
        seq = self._seq.get(sid)
        if seq is None:
            q = select(func.max(steps.c.seq)).where(steps.c.session_id == sid)
            top = self._query(conn, q).scalar()
            seq = 0 if top is None else int(top) + 1
        if not peek:
            self._seq.put(sid, seq + 1)
        return int(seq)

    def _step_row(
        self,
        rec: StepRecord,
        step_id: str,
        choice: ChoiceCapture,
        sid: str,
        seq: int,
        sha: str,
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
            "prompt_token_ids": codec.pack_ids(rec.prompt_token_ids),
            "completion_token_ids": codec.pack_ids(choice.token_ids),
            "logprobs": codec.pack_floats(choice.logprobs)
            if choice.token_ids is not None
            else None,
            "tier": rec.tier,
            "model": rec.model,
            "replica": rec.replica,
            "policy": rec.policy,
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
        """Pair tool messages in this request with the pending calls they answer."""
        results = {
            m.get("tool_call_id"): m.get("content")
            for m in messages or ()
            if isinstance(m, dict) and m.get("role") == "tool" and m.get("tool_call_id")
        }
        if not results:
            return []
        pending = self._query(
            conn,
            select(tool_calls.c.id, tool_calls.c.call_id, tool_calls.c.exit_status).where(
                tool_calls.c.session_id == sid,
                tool_calls.c.call_id.in_(list(results)),
                tool_calls.c.result.is_(None),
            ),
        ).all()
        out = []
        for call_pk, call_id, exit_status in pending:
            text = results[call_id]
            text = text if isinstance(text, str) else orjson.dumps(text).decode()
            ok = (
                exit_status == 0
                if exit_status is not None
                else rewards.tool_outcome_from_text(text)
            )
            self._query(
                conn,
                update(tool_calls)
                .where(tool_calls.c.id == call_pk)
                .values(result=text, result_step_id=step_id, status="ok" if ok else "error"),
            )
            out.append(
                _reward(rec, sid, None, call_pk, "tool_success", 1.0 if ok else -1.0, created)
            )
        return out

    def _session_calls(self, conn: Connection, sid: str) -> set[str]:
        made = self._calls.get(sid)
        if made is None:
            q = select(tool_calls.c.tool, tool_calls.c.arguments).where(
                tool_calls.c.session_id == sid
            )
            made = {rewards.call_signature(t, a) for t, a in self._query(conn, q)}
            self._calls.put(sid, made)
        return made

    def _hooks(self, rec: StepRecord, choice: ChoiceCapture) -> dict[str, float]:
        out: dict[str, float] = {}
        if not self.hooks:
            return out
        view = {
            "request": rec.request,
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


def session_row(rec: StepRecord, sid: str) -> dict[str, Any]:
    return {
        "id": sid,
        "tenant_id": rec.tenant,
        "api_key": rec.api_key,
        "external_id": rec.external_session,
        "task_id": rec.task_id,
        "group_id": rec.group_id,
        "task_spec": None,
        "status": "open",
        "outcome": None,
        "created_at": now_utc(rec.created_at),
        "ended_at": None,
    }


def _reward(
    rec: StepRecord,
    sid: str,
    step_id: str | None,
    call_id: str | None,
    name: str,
    value: float,
    created: datetime,
) -> dict[str, Any]:
    scope = "tool_call" if call_id else "step" if step_id else "session"
    return {
        "tenant_id": rec.tenant,
        "session_id": sid,
        "step_id": step_id,
        "tool_call_id": call_id,
        "scope": scope,
        "name": name,
        "value": value,
        "source": "gateway",
        "created_at": created,
    }

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
step: one of them reads the last step number of every session the batch touches, another
the open calls that its steps' tool messages may answer (``ToolCalls.prefetch``).

The pieces: ``numbering`` keeps what this writer knows of sessions' step numbers (and
notices another writer's steps), ``tool_calls`` builds call rows and pairs results with
them, ``batch`` holds the pending rows, the statements and the row builders.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
from sqlalchemy import Connection

from gateway.recording import context_event
from gateway.recording.batch import (
    CONTINUED,
    LRU,
    Pending,
    continued,
    reward_row,
    session_row,
    step_row,
)
from gateway.recording.numbering import SessionNumbers
from gateway.recording.prompt_ref import Lasts, Template, encode
from gateway.recording.records import ChoiceCapture, RawJson, StepRecord, ToolResultRecord
from gateway.recording.tool_calls import ToolCalls
from gateway.store import chain, rewards
from gateway.store.rows import insert_ignore, now_utc, session_key
from gateway.store.schema import tenants
from sandbox.toolschema import tool_schemas

log = logging.getLogger(__name__)


class StepWriter:
    """Writes records; keeps caches (tenants, chains, last step numbers, tool calls) across
    batches."""

    def __init__(
        self,
        hooks: list[tuple[str, rewards.Hook]] | None = None,
        cache: int = 100_000,
        prompt_cache_mb: float = 64.0,
        history_cache_mb: float = 64.0,
    ):
        self.hooks = hooks or []
        self._cache = cache
        self._tenants: set[str] = set()
        self._chains = LRU(cache)  # (tenant, continuation hash) -> session id
        self._calls = ToolCalls(cache // 10)
        # session id -> the continuation hashes of its steps, for a session whose every
        # step was this writer's: whether a step extends one of its answers, without a query
        self._own = LRU(cache // 10)
        # what the caches are up to date with: another writer's steps make them forget
        self._numbers = SessionNumbers(cache, forget=self._forget_session)
        # session id -> its last step's prompt ids, which the next one's refer to
        self._lasts = Lasts(int(prompt_cache_mb * 2**20))
        # the last prompt stored whole: the next session's first prompt copies the packed
        # ids they begin with (one agent's system prompt and tools) instead of parsing them
        self._template = Template()
        # the open hashes of recent continuations: a session's next step hashes only what
        # it adds to its history (0 MB: every step hashes its whole history)
        self._histories = chain.ChainCache(max_mb=history_cache_mb)
        self._pending = Pending()

    def forget_caches(self) -> None:
        """After a rolled-back batch the caches may name rows that were never committed."""
        self._tenants.clear()
        self._chains.clear()
        self._numbers.clear()
        self._calls.clear()
        self._own.clear()
        self._lasts.clear()
        self._pending = Pending()

    def write(self, conn: Connection, records: Sequence[StepRecord | ToolResultRecord]) -> None:
        """Write ``records`` in ``conn``'s transaction. Reads never need what is pending:
        the caches hold every chain link and tool call this batch adds, so the batch is
        one INSERT per table however many lookups it made."""
        self._check_known(conn, records)
        for rec in records:
            if isinstance(rec, ToolResultRecord):
                self._calls.sandbox_result(conn, self._pending, rec)
            else:
                self._write_one(conn, rec)
        p = self._pending
        self._numbers.committed(p, p.flush(conn))
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
                history = self._history(rec, messages)
                prefix = history.prefix()
        sid, rewritten = self._session(conn, rec, prefix)
        if rec.context is not None:  # a condensed prompt: its summary steps, then the event
            self._condensation(conn, rec, sid)
        seq = self._numbers.take(conn, self._pending, sid)
        created = now_utc(rec.created_at)
        schemas = tool_schemas(request.get("tools"))
        prompt, last = encode(
            self._lasts.get(sid), rec.prompt_token_ids, self._lasts.budget > 0, self._template
        )
        step_rows, reward_rows, call_rows = [], [], []
        choices = rec.choices or [ChoiceCapture(0)]
        for i, (step_id, choice) in enumerate(zip(rec.step_ids, choices, strict=False)):
            if hashed is not None:
                cont = hashed.continuations[i]
            else:
                cont = history.continuation(choice.message) if history is not None else None
            if cont is not None:
                self._link(rec.tenant, sid, cont)
            step_rows.append(step_row(rec, step_id, choice, sid, seq, sha, prompt, created))
            step_rows[-1].update(
                rewritten=rewritten, prefix_sha256=prefix, continuation_sha256=cont
            )
            checks = []
            for call in (choice.message or {}).get("tool_calls") or ():
                row = self._calls.row(
                    conn, self._pending, rec, step_id, sid, call, schemas, created
                )
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
        p = self._pending
        # The results this request carries answer earlier calls, not this step's own.
        reward_rows += self._calls.results(conn, p, rec, sid, rec.step_ids[0], messages, created)
        p.steps.extend(step_rows)
        self._calls.add(p, call_rows)
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
        seq = self._numbers.take(conn, self._pending, sid)
        # whole: the agent's steps refer on
        prompt, _ = encode(None, rec.prompt_token_ids, template=self._template)
        row = step_row(rec, rec.step_ids[0], rec.choices[0], sid, seq, sha, prompt,
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
            if not self._numbers.has_steps(conn, self._pending, sid):
                # (a session with a step has its row: committed, or pending in this batch)
                self._pending.sessions.setdefault(sid, session_row(rec, sid))
                self._owned(sid)
                return sid, False  # the session's first step: nothing to rewrite
            # Later steps must extend an earlier answer of this session; anything else
            # (a summary, a truncated or edited history) is a rewrite.
            own = self._own.get(sid)
            if own is not None:
                return sid, prefix is None or prefix not in own
            return sid, prefix is None or self._continues(conn, rec.tenant, prefix) != sid
        found = self._continues(conn, rec.tenant, prefix) if prefix else None
        if found is not None:
            return found, False
        sid = uuid.uuid4().hex  # a new session: nothing to look up for it later
        self._pending.sessions[sid] = session_row(rec, sid)
        self._numbers.new_session(self._pending, sid)
        self._owned(sid)
        return sid, False

    def _history(self, rec: StepRecord, messages: list[Any]) -> chain.History:
        """The request's messages hashed from where this writer's caches left off: the
        answer they continue, or (a named session) its last request."""
        named = rec.external_session
        key = None if named is None else session_key(rec.tenant, named)
        return chain.History(messages, self._histories, key)

    def _link(self, tenant: str, sid: str, cont: str) -> None:
        """A step of session ``sid`` ends in continuation ``cont``: a next step extends it."""
        self._chains.put(f"{tenant}\x00{cont}", sid)
        own = self._own.get(sid)
        if own is not None:
            own.add(cont)

    def _owned(self, sid: str) -> None:
        """Session ``sid`` has no step anywhere and its first is this writer's: what it
        adds is known here, until another writer's step makes it forget
        (``_forget_session``)."""
        self._calls.new_session(sid)
        self._own.put(sid, set())

    def _forget_session(self, sid: str) -> None:
        self._calls.forget(sid)
        self._own.pop(sid, None)

    def _continues(self, conn: Connection, tenant: str, prefix: str) -> str | None:
        hit = self._chains.get(f"{tenant}\x00{prefix}")
        if hit is not None:
            return str(hit)
        read = self._pending.continued
        if (tenant, prefix) in read:  # read at the batch's start (``_check_known``)
            return read[(tenant, prefix)]
        row = conn.execute(CONTINUED, {"tenant": tenant, "prefix": prefix}).first()
        return None if row is None else str(row[0])

    def _check_known(
        self, conn: Connection, records: Sequence[StepRecord | ToolResultRecord]
    ) -> None:
        """Read, in one statement, the last step number of the sessions this batch's steps
        name (or continue, by a chain link cached here) and that this writer remembers;
        then, in one more, the open calls their tool messages may answer
        (``ToolCalls.prefetch``). Before them, the continuation hashes of the steps that
        name no session and are not cached here are read in one statement too
        (``batch.continued``): a new session's first step would otherwise cost a query of
        its own, and a step that continues a session this writer does not remember (written
        before a restart, or by another replica) three. The sessions found there join
        both reads."""
        sids = set()
        asks: list[tuple[str, Any]] = []
        unknown: dict[str, set[str]] = {}
        unlinked: list[StepRecord] = []
        for rec in records:
            if not isinstance(rec, StepRecord):
                continue
            sid = None
            if rec.external_session is not None:
                sid = session_key(rec.tenant, rec.external_session)
            elif rec.chain is not None and rec.chain.prefix:
                hit = self._chains.get(f"{rec.tenant}\x00{rec.chain.prefix}")
                sid = None if hit is None else str(hit)
                if sid is None:
                    unknown.setdefault(rec.tenant, set()).add(rec.chain.prefix)
                    unlinked.append(rec)
            if sid is None:
                continue
            sids.add(sid)
            if rec.endpoint == "chat" and isinstance(rec.request, dict):
                asks.append((sid, rec.request.get("messages")))
        p = self._pending
        found: set[str] = set()
        if unknown:
            p.continued = continued(conn, unknown)
            for rec in unlinked:
                assert rec.chain is not None and rec.chain.prefix is not None
                sid = p.continued.get((rec.tenant, rec.chain.prefix))
                if sid is None:
                    continue
                found.add(sid)
                if rec.endpoint == "chat" and isinstance(rec.request, dict):
                    asks.append((sid, rec.request.get("messages")))
        self._numbers.check(conn, p, sids, found)
        # a session known to have no step has no committed call (``Pending.fresh``)
        self._calls.prefetch(conn, p, [(s, m) for s, m in asks if p.tops.get(s) != -1])

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

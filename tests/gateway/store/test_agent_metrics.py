"""The five agent metrics, computed from sessions written the way the gateway writes them
(the recorder's writer, the tool-result and session-end queries), on SQLite and PostgreSQL."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from gateway.recording.records import ChoiceCapture, StepRecord
from gateway.recording.writer import StepWriter
from gateway.store import agent_metrics, queries
from gateway.store.database import make_engine, upgrade
from gateway.store.rows import session_key
from gateway.store.schema import sessions

GRANTED = {"allowed": True, "rule": "grant", "reason": "granted", "duration_ms": 12.0}


def _step(tenant, key, session, tier, *, status=200, calls=(), version="v-base"):
    message = {"role": "assistant", "content": None if calls else "done"}
    if calls:
        message["tool_calls"] = [
            {"id": c, "type": "function", "function": {"name": "run_shell", "arguments": "{}"}}
            for c in calls
        ]
    return StepRecord(
        step_ids=[uuid.uuid4().hex], request_id=uuid.uuid4().hex, tenant=tenant, api_key=key,
        endpoint="chat", request={"messages": [{"role": "user", "content": "go"}]},
        external_session=session, task_id=None, group_id=None, created_at=time.time(),
        status=status, tier=tier, routing_version=version,
        choices=[] if status != 200 else [ChoiceCapture(0, message, [1], [0.0], "stop")],
    )  # fmt: skip


@pytest.fixture
def store(store_url):
    upgrade(store_url)
    engine = make_engine(store_url)
    steps = [
        _step("acme", "k1", "s1", "full", calls=["c1"]),
        _step("acme", "k1", "s1", "fast"),
        _step("acme", "k1", "s1", "fast"),
        _step("acme", "k1", "s2", "fast", calls=["c2", "c3"], version="v-canary"),
        _step("acme", "k1", "s2", "fast", version="v-base"),  # published mid-session
        _step("acme", "k2", "s3", "full", status=504),
        _step("zeta", "z", "s4", "full"),
    ]
    with engine.begin() as conn:
        StepWriter([]).write(conn, steps)
    with engine.begin() as conn:
        assert queries.record_tool_result(
            conn, "acme", "s1", "c1", GRANTED | {"exit_status": 0, "text": "ok"}
        )
        assert queries.record_tool_result(
            conn, "acme", "s2", "c2",
            GRANTED | {"exit_status": 137, "limit": "wall_time", "text": "killed"},
        )  # fmt: skip
        assert queries.record_tool_result(
            conn, "acme", "s2", "c3", {"allowed": False, "rule": "deny", "reason": "no", "text": ""}
        )
        queries.end_session(conn, "acme", "s1", "success", None)
        queries.end_session(conn, "acme", "s2", "failed", -1.0)
        queries.end_session(conn, "zeta", "s4", "PASSED", None)
        for sess, score in (("s1", 1.0), ("s3", 0.0)):
            queries.add_feedback(
                conn, "acme", session=sess, step=None, score=score, label=None, comment=None
            )
    yield engine
    engine.dispose()


def _by(rows, **group):
    (row,) = [r for r in rows if r.group == group]
    return row


def test_the_five_metrics_per_tenant(store):
    with store.connect() as conn:
        rows = agent_metrics.compute(conn, group_by="tenant")
    assert [r.group for r in rows] == [{"tenant": "acme"}, {"tenant": "zeta"}]
    acme = _by(rows, tenant="acme")
    assert (acme.sessions, acme.sessions_with_verdict) == (3, 2)
    assert acme.task_success_rate == 0.5  # s1 "success"; s2's negative outcome reward fails it
    assert (acme.steps, acme.avg_steps) == (6, 2.0)
    assert acme.fast_step_share == pytest.approx(4 / 6)
    # c1 ok, c2 killed by its wall-time limit, c3 denied
    assert (acme.tool_calls, acme.tool_failure_rate) == (3, pytest.approx(2 / 3))
    # one tool timeout and one model call that ended in a 504, over 3 calls + 6 model calls
    assert (acme.timeouts, acme.timeout_rate) == (2, pytest.approx(2 / 9))
    assert (acme.feedback_count, acme.satisfaction) == (2, 0.5)
    zeta = _by(rows, tenant="zeta")
    assert (zeta.task_success_rate, zeta.tool_failure_rate, zeta.satisfaction) == (1.0, None, None)


def test_per_agent_and_per_tier_mix(store):
    with store.connect() as conn:
        agents = agent_metrics.compute(conn, group_by="agent", tenant="acme")
        mix = agent_metrics.compute(conn, group_by="tier_mix")
    assert [r.group["agent"] for r in agents] == ["k1", "k2"]
    k2 = _by(agents, tenant="acme", agent="k2")
    assert (k2.sessions, k2.task_success_rate, k2.timeouts) == (1, None, 1)  # still open
    assert {r.group["tier_mix"]: r.sessions for r in mix} == {"fast": 1, "full": 2, "mixed": 1}
    assert _by(mix, tier_mix="fast").task_success_rate == 0.0


def test_per_routing_version_a_session_counts_for_its_first_steps_version(store):
    with store.connect() as conn:
        rows = agent_metrics.compute(conn, group_by="routing_version", tenant="acme")
    assert {r.group["routing_version"]: r.sessions for r in rows} == {"v-base": 2, "v-canary": 1}
    canary = _by(rows, routing_version="v-canary")
    assert (canary.task_success_rate, canary.tool_failure_rate) == (0.0, 1.0)


def test_the_window_counts_sessions_by_their_start(store):
    past = datetime.now(UTC) - timedelta(days=3)
    with store.begin() as conn:
        conn.execute(
            update(sessions)
            .where(sessions.c.id == session_key("acme", "s1"))
            .values(created_at=past)
        )
    with store.connect() as conn:
        recent = agent_metrics.compute(
            conn, tenant="acme", since=datetime.now(UTC) - timedelta(days=1)
        )
        old = agent_metrics.compute(conn, tenant="acme", until=past + timedelta(seconds=1))
        future = agent_metrics.compute(conn, since=datetime.now(UTC) + timedelta(hours=1))
    assert (recent[0].sessions, recent[0].task_success_rate) == (2, 0.0)
    assert (old[0].sessions, old[0].steps, old[0].feedback_count) == (1, 3, 1)
    assert future == []


def test_a_bad_grouping_is_refused(store):
    with store.connect() as conn, pytest.raises(ValueError, match="group_by"):
        agent_metrics.compute(conn, group_by="model")  # type: ignore[arg-type]


def _vm_steps(engine, group_by: str) -> int:
    """SQLite virtual-machine instructions one ``compute`` runs (counted in thousands by a
    progress handler): a measure of the query's work that does not depend on the machine."""
    count = 0

    def tick() -> int:
        nonlocal count
        count += 1
        return 0

    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        raw.set_progress_handler(tick, 1000)
        try:
            agent_metrics.compute(conn, group_by=group_by)  # type: ignore[arg-type]
        finally:
            raw.set_progress_handler(None, 1000)
    return count


@pytest.mark.parametrize("group_by", agent_metrics.GROUPS)
def test_the_work_grows_with_the_sessions_not_their_square(tmp_path, group_by):
    """The exporter recomputes a day of sessions every few minutes inside the gateway: a
    query whose work grows with the square of the sessions (a derived table scanned once
    per session, as the routing-version join once was: 5.5 s of a core for 10,000
    sessions) takes the gateway's core from its requests. Four times the sessions must
    cost about four times the work."""
    work = []
    for n in (150, 600):
        url = f"sqlite:///{tmp_path}/{n}.db"
        upgrade(url)
        engine = make_engine(url)
        records = [
            _step("acme", f"k{i % 3}", f"s{i}", "fast" if i % 2 else "full",
                  calls=[f"c{i}"] if i % 5 == 0 else (), version=f"v{i % 2}")
            for i in range(n)
            for _ in range(2)
        ]  # fmt: skip
        with engine.begin() as conn:
            StepWriter([]).write(conn, records)
        work.append(_vm_steps(engine, group_by))
        engine.dispose()
    assert work[0] > 0
    assert work[1] / work[0] < 6, work  # linear: ~4; a per-session scan: ~16

"""The writer at idle priority: where it runs so, and the rescue of a starved writer."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.config import StoreSettings
from gateway.metrics import Metrics
from gateway.recording import writer_priority
from gateway.recording.recorder import Recorder
from gateway.recording.writer_priority import IdleSchedule, StarvationWatch
from tests.gateway.recording.test_recorder import count_steps, rec

needs_idle = pytest.mark.skipif(
    not (writer_priority.can_go_idle() and writer_priority.may_raise(10)),
    reason="no SCHED_IDLE, no /proc/PID/schedstat or no CAP_SYS_NICE here",
)


def settings(tmp_path: Path, **kw) -> StoreSettings:
    return StoreSettings(
        url=f"sqlite:///{tmp_path}/r.db", dead_letter_path=str(tmp_path / "dead.jsonl"), **kw
    )


async def policy_of(r: Recorder) -> int:
    """The writer's scheduling policy once the recorder's watch has looked at it twice."""
    await asyncio.sleep(2 * writer_priority.WATCH_S + 0.1)
    assert r.writer_pid is not None
    return os.sched_getscheduler(r.writer_pid)


async def written(r: Recorder, timeout_s: float = 120) -> None:
    """Every step offered so far committed (an operation queued behind them has run)."""
    await asyncio.wait_for(r.call(lambda conn: None), timeout_s)


@needs_idle
async def test_the_writer_runs_at_idle_priority_unless_configured_not_to(tmp_path):
    for idle, policy in ((True, os.SCHED_IDLE), (False, os.SCHED_OTHER)):
        r = Recorder(settings(tmp_path / str(idle), writer_idle=idle), Metrics())
        await r.start()
        try:
            await r.record(rec())
            await written(r)
            assert await policy_of(r) == policy
            assert r.writer_pid is not None
            assert os.getpriority(os.PRIO_PROCESS, r.writer_pid) == 10  # writer_nice
        finally:
            await r.close()


@needs_idle
@pytest.mark.parametrize("privileged", [True, False], ids=["in-place", "restarted"])
async def test_a_starved_writer_is_brought_back_to_its_niceness_and_loses_nothing(
    tmp_path, monkeypatch, privileged
):
    """A busy loop at normal priority on the writer's only CPU: at idle priority the writer
    would get ~0.3 % of it. The recorder moves it back to writer_nice in place; should
    that fail, it kills it and starts a new one, and the batch in flight is sent again."""
    if not privileged:  # bringing it back fails all the same: the fallback
        monkeypatch.setattr(writer_priority, "set_normal", lambda pid: False)
    cpu = max(os.sched_getaffinity(0))
    metrics = Metrics()
    r = Recorder(settings(tmp_path, writer_cpus=[cpu]), metrics)
    await r.start()
    hog = None
    try:
        await r.record(rec())
        await written(r)
        first = r.writer_pid
        assert first is not None
        assert await policy_of(r) == os.SCHED_IDLE  # the recorder's watch put it there
        code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
        hog = subprocess.Popen([sys.executable, "-c", code])
        await asyncio.sleep(0.2)  # the hog has the CPU
        started = time.monotonic()
        for i in range(400):  # ~40 ms of the writer's CPU: ~15 s at idle priority
            assert await r.record(rec(content=f"step {i} " + "x" * 4000))
        await written(r)
        took = time.monotonic() - started
        assert count_steps(r) == 401
        assert metrics.registry.get_sample_value("gearshift_recorder_writer_starved_total") == 1
        assert (r.writer_pid == first) is privileged
        assert os.sched_getscheduler(r.writer_pid) == os.SCHED_OTHER  # its cool-down
        assert os.getpriority(os.PRIO_PROCESS, r.writer_pid) == 10
        assert took < 60, took
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        await r.close()


def test_the_watch_calls_a_writer_starved_only_after_starved_s_of_it(monkeypatch):
    looks = iter(
        [
            (0, True),  # first look: nothing to compare with
            (1_000_000, True),  # 0.25 s later: runnable, ran 0.4 %: starved
            (2_000_000, True),
            (3_000_000, True),
            (4_000_000, True),  # starved for a whole second
            (100_000_000, True),  # served: the count starts again
            (101_000_000, True),
            (102_000_000, False),  # not runnable (blocked): not starved
            (102_000_000, True),
        ]
    )
    monkeypatch.setattr(writer_priority, "cpu_state", lambda pid: next(looks))
    monkeypatch.setattr(writer_priority, "is_idle", lambda pid: True)
    watch = StarvationWatch(starved_s=1.0)
    seen = [watch.starved(7, now=t * 0.25) for t in range(9)]
    assert seen == [False, False, False, False, True, False, False, False, False]


def test_the_watch_leaves_alone_a_writer_not_at_idle_priority_or_not_wanting_cpu(monkeypatch):
    monkeypatch.setattr(writer_priority, "is_idle", lambda pid: False)
    monkeypatch.setattr(writer_priority, "cpu_state", lambda pid: (0, True))
    watch = StarvationWatch(starved_s=0.5)
    assert not any(watch.starved(7, now=t * 0.25) for t in range(8))
    # at idle priority but blocked (a database away, a pause): not wanting a core
    monkeypatch.setattr(writer_priority, "is_idle", lambda pid: True)
    monkeypatch.setattr(writer_priority, "cpu_state", lambda pid: (0, False))
    watch = StarvationWatch(starved_s=0.5)
    assert not any(watch.starved(7, now=t * 0.25) for t in range(8))
    # a new writer (another pid) starts the count again
    monkeypatch.setattr(writer_priority, "cpu_state", lambda pid: (0, True))
    watch = StarvationWatch(starved_s=0.5)
    assert [watch.starved(pid, now=t * 0.25) for t, pid in enumerate([7, 7, 7, 8, 8, 8])] == [
        False, False, True, False, False, True,
    ]  # fmt: skip


def test_the_cool_down_doubles_only_for_a_writer_that_starves_again_soon(monkeypatch):
    monkeypatch.setattr(writer_priority, "can_go_idle", lambda: True)
    monkeypatch.setattr(writer_priority, "may_raise", lambda nice: True)
    schedule = IdleSchedule(enabled=True, nice=10)
    assert schedule.due(now=100.0)
    assert schedule.rescued(now=100.0) == 5.0  # idle since the start: the first cool-down
    assert not schedule.due(now=104.9) and schedule.due(now=105.0)
    # starved again 1 s after going back, and again, and again: the core stays busy
    assert schedule.rescued(now=106.0) == 10.0
    assert schedule.rescued(now=117.0) == 20.0
    assert schedule.rescued(now=138.0) == 40.0
    # idle for a while without starving: back to the first cool-down
    assert schedule.rescued(now=178.0 + 6) == 5.0
    for i in range(10):
        schedule.rescued(now=300.0 + i)
    assert schedule.rescued(now=400.0) == 600.0  # the cap
    assert not IdleSchedule(enabled=False, nice=10).due()


def test_bringing_a_writer_back_takes_cap_sys_nice_or_a_nice_limit(monkeypatch):
    import resource

    monkeypatch.setattr(writer_priority, "_has_cap_sys_nice", lambda: True)
    assert writer_priority.may_raise(10)
    monkeypatch.setattr(writer_priority, "_has_cap_sys_nice", lambda: False)
    for limit, nice, allowed in [(0, 10, False), (9, 10, False), (10, 10, True), (1, 19, True),
                                 (resource.RLIM_INFINITY, 0, True)]:  # fmt: skip
        monkeypatch.setattr(resource, "getrlimit", lambda which, limit=limit: (limit, limit))
        assert writer_priority.may_raise(nice) is allowed, (limit, nice)


def test_the_writer_stays_at_its_niceness_where_it_could_not_be_brought_back(monkeypatch):
    monkeypatch.setattr(writer_priority, "may_raise", lambda nice: False)
    assert not IdleSchedule(enabled=True, nice=10).due()

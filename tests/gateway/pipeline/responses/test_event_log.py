"""The event log of a streamed background run: readers from any point, while it runs."""

from __future__ import annotations

import asyncio

from gateway.pipeline.responses.event_log import EventLog


def event(n: int) -> bytes:
    return b'event: e\ndata: {"sequence_number": %d}\n\n' % n


async def read_all(log: EventLog, after: int) -> bytes:
    return b"".join([chunk async for chunk in log.follow(after)])


def test_readers_resume_after_a_sequence_number_and_end_with_the_run():
    async def scenario() -> None:
        log = EventLog()
        await log.send({"type": "http.response.start", "status": 200, "headers": []})
        await log.send({"type": "http.response.body", "body": event(0) + event(1)[:7]})
        early = asyncio.create_task(read_all(log, -1))  # from the start
        late = asyncio.create_task(read_all(log, 1))  # after event 1
        await asyncio.sleep(0)
        log.write(event(1)[7:] + event(2))  # an event split across writes is kept whole
        await asyncio.sleep(0)
        assert not early.done()  # it waits for more
        log.write(event(3))
        log.close()
        assert await early == event(0) + event(1) + event(2) + event(3)
        assert await late == event(2) + event(3)
        assert await read_all(log, 3) == b""  # nothing after the last: ends at once
        assert log.events == [event(0), event(1), event(2), event(3)]

    asyncio.run(scenario())

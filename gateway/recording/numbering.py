"""What a writer knows of each session's step numbers, and a step's place in its batch.

A step's number is given at the commit (``Pending.number``), after the session's last
committed step by any writer. What is kept here is the last number this writer knows of,
per session. It says whether a session has steps at all (a session's first step is no
rewrite, and a session with nothing committed has no committed call to answer), and,
checked against the store once a batch, whether another writer (another gateway replica)
has added steps since: then what this writer remembers of the session (its tool calls)
is out of date, and is forgotten.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection

from gateway.recording.batch import LRU, TOP_SEQ, Pending, last_numbers


class SessionNumbers:
    """Sessions' last step numbers known to this writer, across batches; ``forget`` is
    called with a session another writer has added steps to."""

    def __init__(self, cache: int, forget: Callable[[str], None]) -> None:
        # session id -> its last step number known here (-1: none): what the writer's
        # caches are up to date with
        self._top = LRU(cache)
        self._forget = forget

    def clear(self) -> None:
        self._top.clear()

    def new_session(self, p: Pending, sid: str) -> None:
        """Session ``sid`` was started by this writer in this batch: no step anywhere."""
        p.tops[sid] = -1
        self._top.put(sid, -1)

    def check(
        self,
        conn: Connection,
        p: Pending,
        sids: set[str],
        found: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        """Read, in one statement, the last step number of the sessions in ``sids`` that
        this writer remembers, and of those in ``found`` (sessions with a committed step
        that the batch's steps continue: what ``has_steps`` would read for each)."""
        known = sorted({s for s in sids if s in self._top} | found)
        for sid, top in last_numbers(conn, known).items() if known else ():
            self._known(p, sid, top)

    def take(self, conn: Connection, p: Pending, sid: str) -> int:
        """The step's place among this batch's steps of ``sid`` (its number is given at
        the commit: ``Pending.number``)."""
        if not self.has_steps(conn, p, sid):
            p.fresh.add(sid)
        return p.take(sid)

    def has_steps(self, conn: Connection, p: Pending, sid: str) -> bool:
        """Whether session ``sid`` has a step, committed or in this batch."""
        if sid not in p.tops:
            top = conn.execute(TOP_SEQ, {"sid": sid}).scalar()
            self._known(p, sid, -1 if top is None else int(top))
        return p.tops[sid] >= 0 or sid in p.order

    def committed(self, p: Pending, tops: dict[str, int]) -> None:
        """Batch ``p`` was numbered after the sessions' last steps ``tops`` (``flush``)."""
        for sid, top in tops.items():
            if top != p.tops.get(sid, top):  # another writer committed a step meanwhile
                self._forget(sid)
            self._top.put(sid, top + p.order[sid])

    def _known(self, p: Pending, sid: str, top: int) -> None:
        """Session ``sid``'s last committed step number is ``top``: what is remembered of
        it from before is forgotten when another writer has added steps since."""
        if self._top.get(sid) != top:
            self._forget(sid)
            self._top.put(sid, top)
        p.tops[sid] = top

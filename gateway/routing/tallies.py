"""The router's tally of each session's last step, for the session's next step to extend.

An agent resends its whole conversation at every step; the router's counts and features
are sums over the messages (``router.analysis.Tally``), so a step whose messages begin
with its session's last step's reads only what it appends. Kept under the keys routing
keeps the session's state under (``RouteSessions.finish``): a named session's id, or for
an unnamed one the chain keys its answers continue at — the prefix hashes the next step
computes anyway. A tally is only ever extended after its messages compare equal to the
request's, so a wrong or stale entry costs a reading afresh, never a wrong figure.

Bounded: the least recently used go first past ``max_entries`` or ``max_mb`` (the bytes
the messages a tally keeps alive hold, about: ``Tally.size``). Keyed by tenant as well:
one tenant's session never extends another's tally.
"""

from __future__ import annotations

from collections import OrderedDict

from router.analysis import Tally


class Tallies:
    def __init__(self, max_entries: int = 4096, max_mb: float = 32.0) -> None:
        self.max_entries = max_entries
        self.max_bytes = int(max_mb * 2**20)
        self._tallies: OrderedDict[tuple[str, str], Tally] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._tallies)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, tenant: str, key: str | None) -> Tally | None:
        if key is None:
            return None
        tally = self._tallies.get((tenant, key))
        if tally is not None:
            self._tallies.move_to_end((tenant, key))
        return tally

    def put(self, tenant: str, key: str | None, tally: Tally) -> None:
        if key is None:
            return
        old = self._tallies.pop((tenant, key), None)
        if old is not None:
            self._bytes -= old.size
        if tally.size > self.max_bytes or self.max_entries <= 0:
            return
        self._tallies[(tenant, key)] = tally
        self._bytes += tally.size
        while len(self._tallies) > self.max_entries or self._bytes > self.max_bytes:
            _, gone = self._tallies.popitem(last=False)
            self._bytes -= gone.size

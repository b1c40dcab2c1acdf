"""This replica's shares of the usage counters: what its leases in the store hold, and how
much a reservation takes from the store.

A replica's share of one counter is its lease in the store (``usage_leases``, counted in the
counter's ``reserved``), split three ways here:

    free   leased and held by no request: a request that fits takes it with no store call
    held   reserved by this replica's admitted requests, until they settle
    spent  settled usage not yet written to the store (until then the lease still holds it)

Taking and settling only move units between the three, under a lock, in the event loop;
only a store transaction on the ledger's thread changes their sum, the lease: a grant adds
to it, a flush moves ``spent`` to the counter's ``used``, a return gives ``free`` back.

A reservation the shares cannot cover goes to the store, which grants it a block more than
it needs while the counter is far from its cap (``grant``), so the next requests fit in
``free``. Near the cap it grants exactly the reservation and the share returns what a
settlement frees at once: there admission is as exact as a reservation per request.
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_REQUESTS = 64  # a block is this many of the asking request's reservations,
CAP_SHARE = 64  # at most this fraction of the cap,
EDGE_BLOCKS = 4  # and is granted only while this many blocks more still fit under the cap
IDLE_S = 1.0  # a share with no take for this long gives its free part back
RATE_S = 1.0  # a share refilled again within this long has its blocks doubled,
MAX_SCALE = 16  # up to this many times; one refilled after twice as long, halved


@dataclass(slots=True)
class Share:
    free: int = 0
    held: int = 0
    spent: int = 0
    seen: int = 0  # the counter's used + reserved after this replica's last transaction
    exact: bool = True  # the last grant was the reservation alone (the counter is near its cap)
    last: float = 0.0  # monotonic: the last take
    usable_until: float = 0.0  # monotonic: past it, takes go to the store (which renews)
    renew_at: float = 0.0  # monotonic: when the flush renews the lease
    refilling: bool = False  # a refill of ``free`` is queued for the ledger's thread
    scale: int = 1  # refills ask for blocks this many times the usual (``rescale``)
    refilled: float = 0.0  # monotonic: the last refill asked for

    def rescale(self, now: float) -> int:
        """Size the refill asked for at ``now`` to the rate the share is spent at: a block
        spent within ``RATE_S`` doubles the next (at c=16 a block of 64 lasts ~0.2 s, less
        than a refill that waits for SQLite's write lock behind the recorder), a slow one
        halves it. The cap still bounds a block (``grant``): near it, none is granted."""
        since, self.refilled = now - self.refilled, now
        if since < RATE_S:
            self.scale = min(MAX_SCALE, 2 * self.scale)
        elif since >= 2 * RATE_S:
            self.scale = max(1, self.scale // 2)
        return self.scale

    @property
    def leased(self) -> int:
        return self.free + self.held + self.spent

    def total(self) -> int:
        """The counter's used + reserved as far as this replica knows: what the store said
        at the last transaction, less what this replica holds but nobody uses."""
        return self.seen - self.free


def running_low(free: int, amount: int) -> bool:
    """Whether ``free`` is under half a block of ``amount``-sized reservations: a share
    that low is refilled before a request has to wait for it."""
    return free < amount * BLOCK_REQUESTS // 2


def grant(cap: int, remaining: int, amount: int) -> int:
    """What a reservation of ``amount`` takes from the store with ``remaining`` left under
    ``cap`` (``remaining >= amount``): a block more while the counter is far from its cap,
    else the reservation alone."""
    block = min(amount * BLOCK_REQUESTS, cap // CAP_SHARE)
    if block >= 2 * amount and remaining >= amount + EDGE_BLOCKS * block:
        return amount + block
    return amount


@dataclass(slots=True)
class Moves:
    """A flush of one share: ``spent`` to write as used, ``returned`` to give back."""

    spent: int
    returned: int


def plan_flush(
    shares: dict[tuple[str, str, str, str], Share], now: float, due: bool, closing: bool
) -> dict[tuple[str, str, str, str], Moves]:
    """Take out of the shares what the next transaction writes back (undone if it fails):
    spent usage when ``due`` (or near the cap: at once), free parts that are idle, near the
    cap, in debt (a request used more than it reserved) or closing, and a zero move for a
    lease due for renewal."""
    out = {}
    for key, s in shares.items():
        returned = 0
        if s.free and (s.free < 0 or s.exact or closing or now - s.last >= IDLE_S):
            returned = s.free
        spent = s.spent if s.spent and (due or closing or s.exact) else 0
        if returned or spent or (s.leased and now >= s.renew_at):
            s.free -= returned
            s.spent -= spent
            out[key] = Moves(spent, returned)
    return out

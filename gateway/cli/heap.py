"""The collector's settings for a long-running gateway process.

What is alive once start-up has finished (modules, the app, pydantic's validators, the
router's model, SQLAlchemy's metadata: a few hundred thousand objects) lives until the
process exits. CPython's full collection walks every tracked object each time, so with
the defaults a request that happened to trigger one waited 130-250 ms on this project's
standard machine (docs/decisions/gc-freeze.md). ``settle`` moves the start-up objects to
the permanent generation, which no collection walks, and makes young collections rarer:
a request allocates a few thousand containers (an agent's 30-message body, the
upstream's answer), nearly all freed when it ends.

It also shortens the interpreter's switch interval. A worker thread that computes in
Python (the token estimate's refit, 4-30 ms every 500 requests; the control plane's
refresh) keeps the GIL for up to the interval each time the event loop asks for it back,
and the loop gives it up at every socket call: with the default 5 ms, a request that
overlapped a refit waited in whole multiples of 5 ms (docs/decisions/gil-switch-interval.md).
"""

from __future__ import annotations

import gc
import sys

# Allocations (net of frees) between young collections; the default 700 runs one every
# few requests. The older generations keep their defaults.
YOUNG_THRESHOLD = 20_000
# How long a thread that wants the GIL waits before asking its holder to drop it (5 ms by
# default); only threads that compete pay for the shorter one.
SWITCH_INTERVAL_S = 0.0005


def settle() -> int:
    """Collect once, freeze what survives, raise the young threshold, shorten the switch
    interval; returns the number of objects frozen."""
    gc.collect()
    gc.freeze()
    _, mid, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, mid, old)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    return gc.get_freeze_count()

"""Token ids and log-probabilities as packed little-endian arrays.

int32 for ids and float32 for log-probabilities: 4 bytes a token instead of about
8-20 as JSON text, identical on SQLite and PostgreSQL, and decoded in one call.
float32 keeps about 7 significant digits, far more than the bf16 engines produce.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence

_SWAP = sys.byteorder != "little"


def pack_ids(ids: Sequence[int] | None) -> bytes | None:
    if ids is None:
        return None
    # struct packs a list three times faster than array() builds one (9,850 ids: 0.13 ms
    # against 0.39 on this project's standard machine), and says its byte order itself.
    return struct.pack(f"<{len(ids)}i", *ids)


def unpack_ids(raw: bytes | None) -> list[int] | None:
    if raw is None:
        return None
    a = array("i")
    a.frombytes(raw)
    if _SWAP:
        a.byteswap()
    return a.tolist()


def pack_floats(values: Sequence[float] | None) -> bytes | None:
    if values is None:
        return None
    a = array("f", values)
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def unpack_floats(raw: bytes | None) -> list[float] | None:
    if raw is None:
        return None
    a = array("f")
    a.frombytes(raw)
    if _SWAP:
        a.byteswap()
    return a.tolist()

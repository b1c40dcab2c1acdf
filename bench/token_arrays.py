"""Token ids and logprobs stored packed (gateway/store/codec.py) against JSON, in one run.

1,000 tokens: random ids below 49,152 (the default model's vocabulary), exponential
logprobs. Prints bytes and decode time for both encodings and the float32 round-trip error.

    python -m bench.token_arrays [--quick]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import timeit

import orjson

from gateway.store.codec import pack_floats, pack_ids, unpack_floats, unpack_ids


def per_call_us(fn: object, n: int = 2000) -> float:
    return timeit.timeit(fn, number=n) / n * 1e6  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 decodes per timing")
    n = 200 if parser.parse_args().quick else 2000
    rng = random.Random(0)
    ids = [rng.randrange(49152) for _ in range(1000)]
    lps = [-rng.expovariate(2.0) for _ in range(1000)]
    pi, ji, pf, jf = pack_ids(ids), orjson.dumps(ids), pack_floats(lps), orjson.dumps(lps)
    assert pi is not None and pf is not None
    r = {
        "ids_bytes_json": len(ji), "ids_bytes_packed": len(pi),
        "logprobs_bytes_json": len(jf), "logprobs_bytes_packed": len(pf),
        "ids_decode_us_json": round(per_call_us(lambda: orjson.loads(ji), n), 1),
        "ids_decode_us_packed": round(per_call_us(lambda: unpack_ids(pi), n), 1),
        "logprobs_decode_us_json": round(per_call_us(lambda: orjson.loads(jf), n), 1),
        "logprobs_decode_us_packed": round(per_call_us(lambda: unpack_floats(pf), n), 1),
        "float32_max_abs_error": max(abs(a - b) for a, b in zip(lps, unpack_floats(pf) or [], strict=True)),
    }  # fmt: skip
    r["logprobs_size_ratio"] = round(r["logprobs_bytes_json"] / r["logprobs_bytes_packed"], 2)
    for k, v in r.items():
        print(f"{k:28s} {v}")
    print(json.dumps(r))


if __name__ == "__main__":
    main()

"""Fit the router's prompt-token estimate to the serving tier's own tokenizer and template.

The router estimates prompt tokens without a tokenizer call (``router.tokens``): exact
tokenization costs about 0.25 µs a character on one core (a 32k-token session: 40 ms), far
over the decision's 1 ms budget. Its weights come fitted to the embedded model family; another
family counts differently (its tokenizer, and above all its chat template's system turn and
tool preamble). So once the full tier answers, the gateway asks one of its replicas to
``/tokenize`` a fixed set of conversations (vLLM renders them with the tier's own chat
template). A tier that counts them exactly as the default family does keeps the default
weights; another gets weights fitted to them by least squares on relative error, when they
count the conversations better (each left out of the fit in turn) than the default weights
do. The choice and both errors are logged. A replica without ``/tokenize`` (not vLLM)
leaves the default in place, said once.

Then it keeps learning from the tiers' own counts of the prompts they serve
(``usage.prompt_tokens``, which vLLM returns with every answer): every 500 routed requests,
weights fitted to the latest 4,000 replace the current ones when they count the newest
fifth (left out of the trial fit) a tenth better. A deployment's traffic, not the probes,
then decides the weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import statistics
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.routing.refit import Array, ServedWindow, fit_weights, refit_from_traffic
from gateway.upstream.pool import TierPool
from router.tokens import DEFAULT, Counts, TokenModel, counts

log = logging.getLogger(__name__)

PROSE = (
    "The migration moved every order placed before the spring release into the archive "
    "table, and the nightly job now compares the two before it deletes anything. When a "
    "customer writes to support about a missing invoice, the agent looks it up in both "
    "places, explains where it went, and offers to send a fresh copy by email. "
)
CODE = (
    "def merge_intervals(items):\n"
    "    items = sorted(items, key=lambda pair: pair[0])\n"
    "    merged = []\n"
    "    for start, end in items:\n"
    "        if merged and start <= merged[-1][1]:\n"
    "            merged[-1][1] = max(merged[-1][1], end)\n"
    "        else:\n"
    "            merged.append([start, end])\n"
    "    return merged\n"
)
NUMBERS = "Add 48213 and 90177, divide by 36, then subtract 1250.75 from the result. "
RESULT = json.dumps(
    {
        "rows": [
            {"id": 1042, "total": 318.5, "status": "paid"},
            {"id": 1043, "total": 77.0, "status": "open"},
        ]
    }
)


def _tool(name: str, description: str, params: Mapping[str, str]) -> dict[str, Any]:
    properties = {p: {"type": "string", "description": d} for p, d in params.items()}
    schema = {"type": "object", "properties": properties, "required": list(params)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


TOOLS = [
    _tool("get_weather", "Current weather for a city", {"city": "The city's name"}),
    _tool(
        "search_orders",
        "Search the order database by customer, date range and status; returns at most 50 rows",
        {
            "customer": "Customer id or email",
            "since": "ISO date",
            "until": "ISO date",
            "status": "paid, open or void",
        },
    ),
    _tool("read_file", "Read a text file of the repository", {"path": "Path relative to the root"}),
]


def _call(i: int, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def _loop(calls: int, result: str) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Find my open orders from March."}]
    made = [
        _call(i, "search_orders", {"customer": "c-77", "since": f"2026-03-{i + 1:02d}"})
        for i in range(calls)
    ]
    msgs.append({"role": "assistant", "content": None, "tool_calls": made})
    msgs += [{"role": "tool", "tool_call_id": c["id"], "content": result} for c in made]
    return msgs


def _chat(*turns: tuple[str, str], tools: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": r, "content": c} for r, c in turns]}
    if tools:
        body["tools"] = list(tools)
    return body


MARKDOWN = (
    "## Release notes\n\n- **Exports** now stream rows instead of loading the whole table.\n"
    "- Fixed: a `None` in `tool_calls` no longer stops the recorder.\n\n| field | type |\n"
    "|---|---|\n| `id` | string |\n| `reward` | float, -1 to 1 |\n"
)
ACCENTS = "Le café de la gare ouvre à 6 h 30 ; la réunion a lieu à Zürich, puis à Tōkyō (東京). "


# Each count varies on its own across these: text length and kind, digits, messages, a
# system turn, tools offered and their size, tool calls and their results.
PROBES = [
    _chat(("user", "Hi")),
    _chat(("user", PROSE[:120])),
    _chat(("user", PROSE)),
    _chat(("user", PROSE * 4)),
    _chat(("user", NUMBERS)),
    _chat(("user", NUMBERS * 5)),
    _chat(("user", CODE)),
    _chat(("user", MARKDOWN * 2)),
    _chat(("user", ACCENTS * 3)),
    _chat(("system", "Answer briefly."), ("user", PROSE[:200])),
    _chat(("system", PROSE), ("user", CODE)),
    _chat(("system", "You are a support agent."), ("user", PROSE * 2 + NUMBERS), tools=TOOLS[1:]),
    _chat(("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "Tell me a fact.")),
    _chat(*[("user", "ok"), ("assistant", "Done.")] * 4, ("user", "And now?")),
    _chat(("user", CODE * 3), ("assistant", MARKDOWN), ("user", "Shorter, please.")),
    _chat(("user", "Weather in Oslo?"), tools=TOOLS[:1]),
    _chat(("user", "Weather in Oslo?"), tools=TOOLS),
    _chat(("system", "Use the tools."), ("user", PROSE[:150]), tools=TOOLS * 3),
    {"messages": _loop(1, "18 C, clear")},
    {"messages": _loop(3, RESULT), "tools": TOOLS},
    {"messages": _loop(2, RESULT + CODE), "tools": TOOLS * 2},
    {
        "messages": [{"role": "system", "content": "You review code."}, *_loop(2, CODE)],
        "tools": TOOLS[2:],
    },
    {
        "messages": [*_loop(1, MARKDOWN + ACCENTS), {"role": "user", "content": NUMBERS}],
        "tools": TOOLS,
    },
]
MAX_ERROR = 0.15  # median relative error above which neither the fit nor the default is used
# What the family DEFAULT was fitted to (the embedded model: SmolLM2's tokenizer over
# Gearshift's chat template) counts for PROBES, as ``python -m bench.token_estimate`` prints
# them. A tier that counts exactly these is that family: DEFAULT, fitted to 1,700 requests,
# beats any fit to 23 probes there. Regenerate when PROBES change.
DEFAULT_FAMILY_COUNTS = (
    31, 52, 96, 291, 66, 206, 112, 182, 151, 56, 162, 466, 54, 89, 369, 170, 381, 950, 113, 749,
    1071, 465, 613,
)  # fmt: skip

Tokenize = Callable[[Mapping[str, Any]], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class Calibration:
    model: TokenModel  # the weights to route with: the fitted ones, or DEFAULT
    fitted: TokenModel  # fitted to all the probes
    fitted_error: float  # median relative error of the fit, each probe left out in turn
    default_error: float  # DEFAULT's median relative error on the probes (it saw none)
    default_family: bool  # the tier counted the probes exactly as DEFAULT's family does
    probe_counts: tuple[int, ...]

    @property
    def uses_fit(self) -> bool:
        return self.model is self.fitted


def _error(model: TokenModel, body: Mapping[str, Any], truth: int) -> float:
    return abs(model.estimate(body) - truth) / truth


async def calibrate(tokenize: Tokenize, source: str) -> Calibration:
    """Weights fitted to what ``tokenize`` counts for PROBES, or DEFAULT.

    A tier that counts the probes exactly as DEFAULT's family does keeps DEFAULT: fitted to
    1,700 requests, it generalizes better than any fit to 23 probes (``bench.token_estimate``).
    Any other tier gets the better of the fit, judged on probes it did not see (each left
    out in turn), and DEFAULT, which saw none. Raises ValueError when that is off by more
    than MAX_ERROR.
    """
    truth = [await tokenize(b) for b in PROBES]
    rows = [counts(b).vector() for b in PROBES]
    left_out = []
    for i in range(len(PROBES)):
        rest = [k for k in range(len(PROBES)) if k != i]
        model = TokenModel.from_weights(
            fit_weights([rows[k] for k in rest], [truth[k] for k in rest]), source
        )
        left_out.append(_error(model, PROBES[i], truth[i]))
    fitted = TokenModel.from_weights(fit_weights(rows, truth), source)
    fitted_error = statistics.median(left_out)
    default_error = statistics.median(
        _error(DEFAULT, b, t) for b, t in zip(PROBES, truth, strict=True)
    )
    default_family = tuple(truth) == DEFAULT_FAMILY_COUNTS
    model = DEFAULT if default_family or default_error <= fitted_error else fitted
    if min(fitted_error, default_error) > MAX_ERROR:
        raise ValueError(
            f"no weights count within {MAX_ERROR:.0%} of the tier (fitted: off by "
            f"{fitted_error:.0%}, default: {default_error:.0%})"
        )
    return Calibration(model, fitted, fitted_error, default_error, default_family, tuple(truth))


class NoTokenizer(Exception):
    """The replica has no usable ``/tokenize`` (not vLLM, or it refused the requests)."""


def replica_tokenizer(session: aiohttp.ClientSession, url: str, model: str) -> Tokenize:
    async def tokenize(body: Mapping[str, Any]) -> int:
        payload = {**body, "model": model, "add_generation_prompt": True}
        async with session.post(url + "/tokenize", json=payload) as resp:
            if resp.status in (400, 404, 405, 422, 501):
                raise NoTokenizer(f"{url}/tokenize answered {resp.status}")
            resp.raise_for_status()
            data = await resp.json(content_type=None)
        count = data.get("count") if isinstance(data, Mapping) else None
        if not isinstance(count, int) or count <= 0:
            raise NoTokenizer(f"{url}/tokenize answered without a token count")
        return count

    return tokenize


class TokenCalibrator:
    """Checks the estimate once, in the background, as soon as a replica of ``pool``
    answers; until then (and if it cannot) ``model`` is the default. Then keeps learning
    from what the tiers count for the requests they serve (``observe``): every
    ``refit_every`` of them, weights fitted to the latest ``window`` replace ``model`` when
    they count the newest of them better (``refit_from_traffic``)."""

    def __init__(
        self,
        pool: TierPool | None,
        retry_s: float = 5.0,
        timeout_s: float = 30.0,
        window: int = 4000,
        refit_every: int = 500,
    ) -> None:
        self._pool = pool
        self._retry_s = retry_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.model: TokenModel = DEFAULT
        self.result: Calibration | None = None
        self._task: asyncio.Task[None] | None = None
        self._samples = ServedWindow(window)
        self._refit_every = refit_every
        self._since_refit = 0
        self._refitting: asyncio.Task[None] | None = None

    def observe(
        self, sizes: Counts, prompt_tokens: int, estimated: float | None = None
    ) -> float | None:
        """A tier counted ``prompt_tokens`` for a request the router saw as ``sizes`` and
        estimated at ``estimated`` (by default: what the current weights say); returns the
        relative error of that estimate (None: nothing to learn from)."""
        if sizes.token_ids or prompt_tokens <= 0:
            return None
        if estimated is None:
            estimated = self.model.estimate_counts(sizes)
        error = abs(estimated - prompt_tokens) / prompt_tokens
        if self._pool is None:  # calibration off: measured, not learnt from
            return error
        self._samples.add(sizes, prompt_tokens)
        self._since_refit += 1
        if self._since_refit >= self._refit_every and self._refitting is None:
            self._since_refit = 0
            rows, truth = self._samples.ordered()
            self._refitting = asyncio.get_running_loop().create_task(self._refit(rows, truth))
        return error

    async def _refit(self, rows: Array, truth: Array) -> None:
        try:
            found = await asyncio.to_thread(refit_from_traffic, rows, truth, self.model)
        except Exception:  # a numerical failure must not stop the gateway learning later
            log.exception("prompt-token estimate: refitting from served requests failed")
            found = None
        finally:
            self._refitting = None
        if found is not None:
            self.model, trial_error, current_error = found
            log.info(
                "prompt-token estimate refitted to the last %s: off by %.1f%% (median) on "
                "the newest fifth, against %.1f%% before",
                self.model.source, 100 * trial_error, 100 * current_error,
            )  # fmt: skip

    def start(self, session: aiohttp.ClientSession) -> None:
        if self._pool is not None and self._pool.replicas:
            self._task = asyncio.create_task(self._run(session), name="token-calibration")

    async def _run(self, session: aiohttp.ClientSession) -> None:
        assert self._pool is not None
        while True:
            ready = [r for r in self._pool.replicas if r.checked_ok]
            if not ready:  # not up yet: look again soon, calibration waits on nothing else
                await asyncio.sleep(0.25)
                continue
            for replica in ready:
                tokenize = replica_tokenizer(session, replica.url, self._pool.model)
                try:
                    async with asyncio.timeout(self._timeout.total):
                        result = await calibrate(
                            tokenize, f"{self._pool.tier} tier ({replica.url})"
                        )
                except (aiohttp.ClientError, TimeoutError):
                    continue  # try the next replica, or this one again later
                except (NoTokenizer, ValueError) as exc:
                    log.warning(
                        "prompt-token estimate: keeping the default weights (%s); "
                        "route features count tokens as the embedded model family does",
                        exc,
                    )
                    return
                self.model, self.result = result.model, result
                log.info(
                    "prompt-token estimate checked against the %s: weights fitted to it are "
                    "off by %.1f%% (median, each probe left out of the fit), the default "
                    "weights by %.1f%%: routing with the %s",
                    result.fitted.source, 100 * result.fitted_error, 100 * result.default_error,
                    "fitted ones" if result.uses_fit else "default ones, fitted to this family"
                    if result.default_family else "default ones",
                )  # fmt: skip
                return
            await asyncio.sleep(self._retry_s)

    async def stop(self) -> None:
        for task in (self._task, self._refitting):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

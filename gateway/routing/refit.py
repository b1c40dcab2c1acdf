"""Fitting the prompt-token estimate's weights (``router.tokens.TokenModel``): least
squares on relative error with non-negative weights, and the refit to what the tiers
counted for the requests they served (``gateway.routing.calibration`` calls both).

The refit runs in a worker thread every 500 served requests over the latest 4,000, so it
is in numpy throughout (issue #29): the requests are kept as rows of a preallocated array
(``ServedWindow``), not Python objects converted at each refit, and the fit takes the QR
decomposition of the rows once. It took 16-33 ms of CPU holding the GIL in Python, and
now 3 ms (docs/benchmarks.md, "The refit off the GIL's critical path").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from router.tokens import DEFAULT, Counts, TokenModel

Array = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]


def _triangle(a: Array) -> Array:
    """R of ``a``'s QR decomposition (min(rows, columns) rows), by Householder reflections
    in numpy's own loops. Not LAPACK's, nor a BLAS product: on a tall, thin matrix
    OpenBLAS's threads cost several times the work on a busy machine (``lstsq`` on
    4,000 x 10: 3.3 ms of CPU on two threads, 0.43 ms on one; issue #29)."""
    at = a.T.copy()  # a column a row: each reflection works on contiguous memory
    for j in range(min(a.shape)):
        v = at[j, j:].copy()
        norm = float(np.sqrt(np.einsum("i,i", v, v)))
        if norm == 0.0:
            continue
        v[0] += norm if v[0] >= 0 else -norm
        v /= np.sqrt(np.einsum("i,i", v, v))
        block = at[j:, j:]
        block -= np.outer(np.einsum("ij,j->i", block, 2.0 * v), v)
    return np.triu(at[:, : min(a.shape)].T)


def fit_weights(
    rows: Sequence[Sequence[float]] | Array,
    truth: Sequence[int] | Array,
    keep: Sequence[float] | None = None,
) -> list[float]:
    """Least squares on relative error (a short prompt counts as much as a long one), with
    every weight but the constant kept at or above zero: a count the tier's template does
    not render (a template that ignores tools) gets 0, not a small negative weight. A count
    that is zero in every row says nothing about its weight: it keeps ``keep``'s (traffic
    in one script says nothing of the others), or 0."""
    x = np.asarray(rows, dtype=float)
    return _fit(_triangle(_weighted(x, truth)), _nonzero(x), keep)


def _weighted(x: Array, truth: Sequence[int] | Array) -> Array:
    """The rows and, as a last column, the counts, each row divided by its count: least
    squares on these is least squares on relative error."""
    y = np.asarray(truth, dtype=float)
    w = 1.0 / np.maximum(y, 1.0)
    return np.column_stack([x * w[:, None], y * w])


def _nonzero(x: Array) -> Mask:
    """The counts that are not zero in every row."""
    return np.asarray(x.any(axis=0), dtype=bool)


def _fit(r: Array, seen: Mask, keep: Sequence[float] | None) -> list[float]:
    """``fit_weights`` from R of the QR decomposition of the ``_weighted`` rows (``seen``:
    the counts not zero in every row). In numpy throughout, on the rows once: every
    least-squares fit over a subset of the weights is one over R's few rows, the same fit
    (the same singular values)."""
    seen = seen.copy()
    seen[0] = True  # the constant
    free = [int(i) for i in np.flatnonzero(seen)]
    while True:
        fitted, *_ = np.linalg.lstsq(r[:, free], r[:, -1], rcond=None)
        weights = np.zeros(len(seen))
        weights[free] = fitted
        negative = [i for i in free[1:] if weights[i] < 0]
        if not negative:
            if keep is not None:
                weights[~seen] = np.asarray(keep, dtype=float)[~seen]
            return [float(v) for v in weights]
        free.remove(min(negative, key=lambda i: weights[i]))  # the most negative goes first


class ServedWindow:
    """The latest ``size`` requests served, to learn from: each one's design row
    (``Counts.vector``) and what the tier counted, in one preallocated array written as a
    ring. A refit gets them oldest first in one copy, with no Python object per request to
    convert (which would hold the GIL for milliseconds: issue #29)."""

    def __init__(self, size: int) -> None:
        self._data = np.zeros((size, len(DEFAULT.weights()) + 1))
        self._next = 0
        self._filled = 0

    def __len__(self) -> int:
        return self._filled

    def add(self, sizes: Counts, tokens: int) -> None:
        row = self._data[self._next]
        row[:-1] = sizes.vector()
        row[-1] = tokens
        self._next = (self._next + 1) % len(self._data)
        self._filled = min(self._filled + 1, len(self._data))

    def ordered(self) -> tuple[Array, Array]:
        """(design rows, the tier's counts), oldest first: a copy, which later ``add``
        calls leave alone."""
        if self._filled < len(self._data):
            data = self._data[: self._filled].copy()
        else:
            data = np.roll(self._data, -self._next, axis=0)
        return data[:, :-1], data[:, -1]


def _median_error(weights: Sequence[float], rows: Array, truth: Array) -> float:
    """The median relative error of ``TokenModel.estimate_counts`` with ``weights`` over
    ``rows`` (served requests: none given as token ids), computed over the arrays."""
    estimate = np.rint(np.einsum("ij,j->i", rows, np.asarray(weights, dtype=float)))
    np.maximum(estimate, 0.0, out=estimate)
    estimate[~rows[:, 1:].any(axis=1)] = 0.0  # no prompt at all: nothing for the template
    return _median(np.abs(estimate - truth) / truth)


def _median(values: Array) -> float:
    """``np.median`` of a vector without NaNs, the same value: not ``np.median`` itself,
    whose first call imports ``numpy.ma`` (17 ms, holding the GIL in the refit's thread
    while requests wait for it)."""
    n = values.size
    k = n // 2
    if n % 2:
        return float(np.partition(values, k)[k])
    part = np.partition(values, [k - 1, k])
    return float((part[k - 1] + part[k]) / 2)


def refit_from_traffic(
    rows: Array, truth: Array, current: TokenModel, margin: float = 0.9
) -> tuple[TokenModel, float, float] | None:
    """Weights fitted to what the tier counted (``truth``) for served requests (their
    design ``rows``, oldest first: ``ServedWindow.ordered``), when they beat ``current``:
    fitted on the older 80% and judged on the newest 20%, they must cut ``current``'s
    median relative error there by a tenth. Then returns (the weights fitted to all of
    them, the trial's error, ``current``'s error); else None."""
    cut = int(len(rows) * 0.8)
    keep = current.weights()
    weighted = _weighted(rows, truth)
    older = _triangle(weighted[:cut])
    trial = _fit(older, _nonzero(rows[:cut]), keep)
    trial_error = _median_error(trial, rows[cut:], truth[cut:])
    current_error = _median_error(keep, rows[cut:], truth[cut:])
    if trial_error >= margin * current_error:
        return None
    everything = _triangle(np.vstack([older, weighted[cut:]]))  # R of all the rows
    source = f"{len(rows)} requests served by the full tier"
    return (
        TokenModel.from_weights(_fit(everything, _nonzero(rows), keep), source),
        trial_error,
        current_error,
    )

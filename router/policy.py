"""The policy interface and its registry.

A policy is a small object with one method, ``decide(request) -> Decision``.
Policies register themselves by name (one module each under
``router.policies``); configuration selects one with ``build_policy(name,
params)``. No if/elif ladders over names.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from router.types import Decision, RouteRequest


class PolicyError(ValueError):
    """A policy name or its parameters are wrong (a configuration error)."""


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def decide(self, request: RouteRequest) -> Decision: ...


def parts(policy: object) -> Iterator[object]:
    """The policy and, depth first, everything it is built from: the policies it wraps and
    the models it scores with. A policy built on others lists them in a ``parts()`` method."""
    yield policy
    inner = getattr(policy, "parts", None)
    if callable(inner):
        for part in inner():
            yield from parts(part)


PolicyFactory = Callable[[Mapping[str, Any]], Policy]
_REGISTRY: dict[str, PolicyFactory] = {}


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    def wrap(factory: PolicyFactory) -> PolicyFactory:
        if name in _REGISTRY:
            raise PolicyError(f"routing policy {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return wrap


def _load_builtin_policies() -> None:
    import router.policies as pkg

    for module in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{module.name}")


def available_policies() -> list[str]:
    _load_builtin_policies()
    return sorted(_REGISTRY)


def build_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """Build the policy registered as ``name``; raises PolicyError naming the problem."""
    _load_builtin_policies()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise PolicyError(f"unknown routing policy {name!r}; known policies: {known}") from None
    return factory(params or {})

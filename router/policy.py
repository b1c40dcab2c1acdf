"""The policy interface, its registry, and the checking of policy parameters.

A policy is a small object with one method, ``decide(request) -> Decision``.
Policies register themselves by name (one module each under
``router.policies``); configuration selects one with ``build_policy(name,
params)``. No if/elif ladders over names.

A policy declares its parameters as a frozen dataclass with typed fields and defaults, and
its factory builds it with ``parse_params``, which checks the configuration's mapping
against it: unknown and missing keys, each field's type (``int`` refuses ``bool``, ``float``
takes an ``int``; ``X | None``, ``Literal[...]``, mappings, lists and tuples), the range a
field's ``Annotated[..., Check(...)]`` asks for (``Probability``, ``PositiveInt``...), then
the dataclass's own ``__post_init__`` for rules between fields. Every error is a
PolicyError that names the policy and the parameter.
"""

from __future__ import annotations

import importlib
import pkgutil
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Literal,
    Protocol,
    TypeAlias,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from router.types import Decision, RouteRequest

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Params: TypeAlias = Mapping[str, object]  # a policy's configuration, as read from YAML or JSON
P = TypeVar("P", bound="DataclassInstance")


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


PolicyFactory = Callable[[Params], Policy]
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


def build_policy(name: str, params: Params | None = None) -> Policy:
    """Build the policy registered as ``name``; raises PolicyError naming the problem."""
    _load_builtin_policies()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise PolicyError(f"unknown routing policy {name!r}; known policies: {known}") from None
    return factory(params or {})


def _anything(value: Any) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Check:
    """``Annotated`` metadata of a parameter's type: what its value must be, in words (the
    error message says it), and a condition a value of the right type must also meet."""

    wants: str
    ok: Callable[[Any], bool] = _anything


Probability: TypeAlias = Annotated[float, Check("a number between 0 and 1", lambda v: 0 <= v <= 1)]
PositiveFloat: TypeAlias = Annotated[float, Check("a positive number", lambda v: v > 0)]
PositiveInt: TypeAlias = Annotated[int, Check("a positive integer", lambda v: v >= 1)]
NonNegativeInt: TypeAlias = Annotated[int, Check("a non-negative integer", lambda v: v >= 0)]


class _Mismatch(Exception):
    """A value that is not of a parameter's type (``parse_params`` says which and why)."""


_SIMPLE: dict[object, tuple[str, Callable[[object], bool]]] = {
    type(None): ("null", lambda v: v is None),
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
}


def _is_union(origin: object) -> bool:
    return origin is Union or origin is types.UnionType


def _is_mapping(origin: object) -> bool:
    return isinstance(origin, type) and issubclass(origin, Mapping)


def _is_sequence(origin: object) -> bool:
    return origin in (list, tuple, Sequence)


def _convert(tp: object, value: object) -> object:
    """``value`` as a ``tp``: an ``int`` for a ``float`` becomes a float, a list for a tuple a
    tuple, a mapping a dict; raises _Mismatch when it is not one."""
    if tp is Any or tp is object:
        return value
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        value = _convert(args[0], value)
        if not all(m.ok(value) for m in args[1:] if isinstance(m, Check)):
            raise _Mismatch
        return value
    if _is_union(origin):
        for arm in args:
            try:
                return _convert(arm, value)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is Literal:
        if not any(type(value) is type(a) and value == a for a in args):  # True is not 1
            raise _Mismatch
        return value
    if _is_mapping(origin):
        if not isinstance(value, Mapping):
            raise _Mismatch
        key, item = args or (Any, Any)
        return {_convert(key, k): _convert(item, v) for k, v in value.items()}
    if _is_sequence(origin):
        return _sequence(origin, args, value)
    if tp in _SIMPLE:
        if not _SIMPLE[tp][1](value):
            raise _Mismatch
        return float(value) if tp is float and isinstance(value, int) else value
    raise TypeError(f"parse_params cannot check a parameter of type {tp!r}")


def _sequence(origin: object, args: tuple[object, ...], value: object) -> object:
    """A list or tuple in the configuration (a string is not a list of characters)."""
    if not isinstance(value, list | tuple):
        raise _Mismatch
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):  # a fixed-length tuple: one type per position
            raise _Mismatch
        return tuple(_convert(a, v) for a, v in zip(args, value, strict=True))
    items = [_convert(args[0] if args else Any, v) for v in value]
    return items if origin is list else tuple(items)


def _describe(tp: object) -> str:
    """What a value of ``tp`` is, in the words of a configuration's error message."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        checks = [m for m in args[1:] if isinstance(m, Check)]
        return checks[0].wants if checks else _describe(args[0])
    if _is_union(origin):
        return " or ".join(_describe(arm) for arm in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if _is_mapping(origin):
        key, item = args or (Any, Any)
        inner = [f"{part}: {_describe(t)}" for part, t in (("keys", key), ("values", item))
                 if t is not Any and t is not object]  # fmt: skip
        return "a mapping" + (f" ({'; '.join(inner)})" if inner else "")
    if _is_sequence(origin):
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return f"a list of {len(args)} ({', '.join(_describe(a) for a in args)})"
        item = args[0] if args else Any
        return "a list" + (f" (items: {_describe(item)})" if item not in (Any, object) else "")
    return _SIMPLE[tp][0] if tp in _SIMPLE else "anything"


def _show(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_params(cls: type[P], params: Params, policy: str) -> P:
    """``params`` checked against the dataclass ``cls`` and built into one (``cls``'s type
    annotations, resolved with ``typing.get_type_hints``, say what each field takes; a
    field with no default is required). A PolicyError raised by ``cls.__post_init__`` gets
    the policy's name in front."""
    if not isinstance(params, Mapping):
        raise PolicyError(f"{policy}: parameters must be a mapping, got {_show(params)}")
    hints = get_type_hints(cls, include_extras=True)
    declared = [f for f in fields(cls) if f.init]
    known = [f.name for f in declared]
    unknown = sorted((k for k in params if k not in known), key=str)
    if unknown and not known:
        raise PolicyError(f"{policy}: takes no parameters, got {unknown}")
    if unknown:
        raise PolicyError(f"{policy}: unknown parameters {unknown}; known: {', '.join(known)}")
    values: dict[str, object] = {}
    for f in declared:
        if f.name not in params:
            if f.default is MISSING and f.default_factory is MISSING:
                raise PolicyError(f"{policy}: {f.name} is required ({_describe(hints[f.name])})")
            continue
        value = params[f.name]
        try:
            values[f.name] = _convert(hints[f.name], value)
        except _Mismatch:
            wants = _describe(hints[f.name])
            raise PolicyError(f"{policy}: {f.name} must be {wants}, got {_show(value)}") from None
    try:
        return cls(**values)
    except PolicyError as exc:
        raise PolicyError(f"{policy}: {exc}") from None

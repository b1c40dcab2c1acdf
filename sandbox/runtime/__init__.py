"""Where tool code runs. ``Runtime.run`` executes one command in a workspace under limits.

``RUNTIMES`` is the registry ``sandbox.runtime`` selects from: ``bwrap`` (bubblewrap +
seccomp + cgroups; warm sessions) and ``gvisor`` (runsc, a user-space kernel).
"""

from __future__ import annotations

from collections.abc import Callable

from sandbox.runtime.base import Runtime
from sandbox.runtime.bwrap import BwrapRuntime
from sandbox.runtime.gvisor import RunscRuntime

RUNTIMES: dict[str, Callable[[int, int], Runtime]] = {
    "bwrap": BwrapRuntime,
    "gvisor": RunscRuntime,
}

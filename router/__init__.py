"""Tier routing: decides, per request and per agent step, which tier serves it.

Pure Python by contract (no web framework, HTTP client or database imports; the
import-linter contract in ``pyproject.toml`` enforces it), so that the same code
runs on the request path and offline over recorded trajectories.
"""

from router.analysis import Analysis
from router.policy import Policy, PolicyError, available_policies, build_policy, parse_params
from router.types import Decision, Endpoint, RouteRequest, Tier

__all__ = [
    "Analysis",
    "Decision",
    "Endpoint",
    "Policy",
    "PolicyError",
    "RouteRequest",
    "Tier",
    "available_policies",
    "build_policy",
    "parse_params",
]

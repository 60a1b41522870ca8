"""One home for each default a signature, an option or a help text takes: the slot count,
the reply budgets, the LLM call's timeouts and retries, Redis clients' socket timeout.
Every other module imports them; none writes the number again."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

DEFAULT_CONCURRENCY = 32
"""Slots of the gate's pool (a rollout's, a simulated step's; one endpoint's cap)."""

DEFAULT_MAX_TOKENS: Mapping[str, int] = MappingProxyType(
    {"think": 512, "answer": 64, "evolve": 2048})
"""Each call kind's reply budget (0: none sent, the server's default)."""

DEFAULT_TIMEOUT_S = 60.0
"""An LLM call's attempt timeout in seconds."""

DEFAULT_DEADLINE_S = 180.0
"""An LLM call's deadline in seconds, every attempt and wait included."""

DEFAULT_MAX_RETRIES = 5
"""Retries of an LLM call after its first attempt."""

REDIS_SOCKET_TIMEOUT_S = 0.5
"""A Redis client's socket timeout: a dead cache costs a call half a second, once."""

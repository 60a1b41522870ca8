"""Adaptive concurrency for one endpoint: a gradient limiter (in the spirit of Netflix's
concurrency-limits ``Gradient2`` and Envoy's adaptive concurrency filter) with a
multiplicative back-off on overload.

Why: a server's capacity is unknown and differs by orders of magnitude (llama.cpp serves one
request at a time; a hosted API hundreds). Too many calls in flight only queue at the server:
latency grows, fixed timeouts fire, and at a freeze every queued call is wasted. The limiter
starts low and grows while latency holds near its no-load value; it shrinks when latency
rises (requests queue) and halves on a timeout, a 429, a 503 or a 529.

Latency is compared per request kind (``think``, ``answer``, ``evolve``: different prompt
sizes) and per completion token: a reply's latency divided by ``1 + tokens / PREFILL_TOKENS``
(the time of a prefill is about that many decoded tokens on CPU llama.cpp and on hosted
APIs alike), so a long reply is not mistaken for queueing. The no-load value is the lowest
such latency of a request sent while it was alone on the endpoint; when none has been seen
for a while the limiter asks for one (a probe: limit 1 until the endpoint drains).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

PREFILL_TOKENS = 32.0


@dataclass(frozen=True)
class LimitParams:
    """Settings of `GradientLimit` (the defaults suit LLM servers)."""

    initial: int = 2
    """The limit before anything is known: start low."""
    tolerance: float = 1.5
    """Latency may reach this multiple of its no-load value before the limit shrinks."""
    smoothing: float = 0.2
    """How far one sample moves the limit towards its target."""
    backoff: float = 0.5
    """The limit is multiplied by this on a timeout, a 429, a 503 or a 529 (once per round trip)."""
    window: int = 100
    """No-load samples kept per request kind (the no-load value is their minimum)."""
    probe_every: int = 50
    """A probe is asked for after ``probe_every * limit`` answers without a lone request."""

    def __post_init__(self) -> None:
        if self.initial < 1 or self.window < 1 or self.probe_every < 1:
            raise ValueError("LimitParams: initial, window and probe_every must be >= 1")
        if not self.tolerance >= 1 or not 0 < self.smoothing <= 1 or not 0 < self.backoff < 1:
            raise ValueError("LimitParams: tolerance >= 1, 0 < smoothing <= 1, "
                             "0 < backoff < 1")


@dataclass
class GradientLimit:
    """One endpoint's current concurrency limit, between 1 and ``max_limit``."""

    max_limit: int
    params: LimitParams = field(default_factory=LimitParams)
    clock: Callable[[], float] = time.monotonic
    estimate: float = field(init=False)
    probing: bool = field(init=False, default=False)
    decreases: int = field(init=False, default=0)
    _alone: dict[str, deque[float]] = field(init=False, default_factory=dict)
    _any: dict[str, deque[float]] = field(init=False, default_factory=dict)
    _since_alone: int = field(init=False, default=0)
    _last_decrease: float = field(init=False, default=-math.inf)

    def __post_init__(self) -> None:
        if self.max_limit < 1:
            raise ValueError(f"GradientLimit.max_limit must be >= 1, got {self.max_limit}")
        self.estimate = float(min(self.params.initial, self.max_limit))

    @property
    def limit(self) -> int:
        """Calls the endpoint may have in flight now (1 while a probe is wanted)."""
        if self.probing:
            return 1
        return max(1, min(self.max_limit, int(self.estimate)))

    def no_load(self, kind: str) -> float | None:
        """The no-load (normalised) latency of ``kind``, or None before any answer."""
        alone = self._alone.get(kind)
        if alone:
            return min(alone)
        seen = self._any.get(kind)
        return min(seen) if seen else None

    def on_answer(self, kind: str, latency_s: float, tokens: int, sent_in_flight: int,
                  in_flight: int) -> None:
        """An answered request: ``sent_in_flight`` requests (itself included) were in flight
        when it was sent, ``in_flight`` are now (it excluded)."""
        p = self.params
        norm = max(latency_s, 1e-6) / (1.0 + max(tokens, 0) / PREFILL_TOKENS)
        self._any.setdefault(kind, deque(maxlen=p.window)).append(norm)
        if sent_in_flight <= 1:
            self._alone.setdefault(kind, deque(maxlen=p.window)).append(norm)
            self._since_alone, self.probing = 0, False
        else:
            self._since_alone += 1
            # at its cap the limit cannot grow: nothing a probe would tell is of use
            if self._since_alone >= p.probe_every * max(1, self.limit) \
                    and 2 <= self.estimate < self.max_limit:
                self.probing = True
        base = self.no_load(kind)
        assert base is not None
        gradient = max(0.5, min(1.0, p.tolerance * base / norm))
        if gradient >= 1.0 and in_flight + 1 < self.estimate / 2:
            return  # not using the limit it has: no evidence that more would help
        # latency holding: grow by sqrt(limit) (fast from a low start); queueing: keep one
        # request waiting at most, so the server never idles between answers
        queue = math.sqrt(self.estimate) if gradient >= 1.0 else 1.0
        target = self.estimate * gradient + queue
        self.estimate = (1 - p.smoothing) * self.estimate + p.smoothing * target
        self.estimate = max(1.0, min(float(self.max_limit), self.estimate))

    def on_overload(self, sent_at: float) -> None:
        """A timeout, 429, 503 or 529 of a request sent at ``sent_at`` (the limiter's clock): the
        limit is cut, once for all the requests sent before the last cut."""
        if sent_at < self._last_decrease:
            return
        self._last_decrease = self.clock()
        self.estimate = max(1.0, self.estimate * self.params.backoff)
        self.decreases += 1

"""Measured model speed, from the `timings` llama-server returns with every reply.

Used to size output caps to the time left, to estimate when a queued save will
be extracted, and shown on /ready. An exponential moving average: the laptop
that goes into swap should be noticed within a few requests.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Throughput:
    alpha: float = 0.3
    _prompt_tps: float | None = None
    _gen_tps: float | None = None
    _job_s: float | None = None
    _system_cached: bool = False
    # "measured", or where the first figures came from before any call was measured
    source: str = "unmeasured"
    # even the smallest piece missed its window: since when, how many pauses in a row, no call before `_paused_until`
    _slow_since: float | None = None
    _slow_pauses: int = 0
    _paused_until: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def prior(self, prompt_tps: float | None, gen_tps: float | None, source: str) -> None:
        """Start from figures measured elsewhere (the bootstrap's smoke test of this build on this machine)."""
        with self._lock:
            if self._prompt_tps is None and prompt_tps and gen_tps:
                self._prompt_tps, self._gen_tps, self.source = float(prompt_tps), float(gen_tps), source

    def observe(self, timings: dict[str, Any], system_tokens: int = 0, fitted: bool = True) -> None:
        """A call's speed; `fitted`: it answered in full within its window (False: cut at a cap lowered for speed)."""
        with self._lock:
            self.source = "measured"
            if fitted:  # a call answered within its window: whatever made the machine too slow is over
                self._slow_since, self._slow_pauses, self._paused_until = None, 0, 0.0
            if system_tokens:
                # llama.cpp reuses the KV cache of an identical prefix: is the system prompt being served from it?
                self._system_cached = float(timings.get("cache_n") or 0) >= 0.8 * system_tokens
            pps = timings.get("prompt_per_second")
            gps = timings.get("predicted_per_second")
            if pps and (timings.get("prompt_n") or 0) >= 8:
                self._prompt_tps = _ema(self._prompt_tps, float(pps), self.alpha)
            if gps and (timings.get("predicted_n") or 0) >= 4:
                self._gen_tps = _ema(self._gen_tps, float(gps), self.alpha)

    def slow_down(self, prompt_tokens: int, budget_s: float, factor: float = 0.5) -> None:
        """A call of `prompt_tokens` ran out of `budget_s`: the machine is slower than measured.

        Assume `factor` of the measured speed (or, unmeasured, of a speed at which
        this call would just have fitted), so the next chunk is smaller. The next
        answered call measures the real speed again.
        """
        with self._lock:
            fitted = max(1.0, prompt_tokens / max(budget_s, 0.1))
            self._prompt_tps = factor * min(self._prompt_tps or fitted, fitted)
            # CPU generation is typically 3-5x slower than prompt reading
            self._gen_tps = factor * (self._gen_tps or self._prompt_tps / factor / 3)
            self.source = "lowered after a timeout"

    def too_slow(self, now: float, first_s: float, max_s: float) -> float:
        """Even the smallest piece missed its window: how long its job waits (doubling, at most `max_s`).

        The model itself is tried again, with whatever job is due, after `first_s`: a machine busy for a
        while is noticed to be free within that, not after the job's longer pause.
        """
        with self._lock:
            if self._slow_since is None:
                self._slow_since = now
            pause = min(max_s, first_s * 2.0 ** min(self._slow_pauses, 40))
            self._slow_pauses += 1
            self._paused_until = max(self._paused_until, now + min(pause, first_s))
            return pause

    def slow_for(self, now: float) -> float | None:
        """Seconds the model has been too slow for the budget (None when a call last fitted)."""
        since = self._slow_since
        return None if since is None else now - since

    def paused_for(self, now: float) -> float:
        """Seconds before this model should be given a job again (0: now)."""
        return max(0.0, self._paused_until - now)

    def system_cached(self) -> bool:
        return self._system_cached

    def observe_job(self, seconds: float) -> None:
        with self._lock:
            self._job_s = _ema(self._job_s, seconds, self.alpha)

    def prompt_tps(self) -> float | None:
        return self._prompt_tps

    def generation_tps(self) -> float | None:
        return self._gen_tps

    def job_seconds(self) -> float | None:
        return self._job_s

    def snapshot(self) -> dict[str, float | str | None]:
        return {
            "prompt_tokens_per_s": round(self._prompt_tps, 1) if self._prompt_tps else None,
            "generation_tokens_per_s": round(self._gen_tps, 1) if self._gen_tps else None,
            "seconds_per_job": round(self._job_s, 2) if self._job_s else None,
            "source": self.source,
            # set while even the smallest piece misses its window: the jobs wait (`deferred` in the job counts)
            "slower_than_budget_since": round(self._slow_since, 3) if self._slow_since else None,
            "paused_until": round(self._paused_until, 3) if self._slow_since else None,
        }


def _ema(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new

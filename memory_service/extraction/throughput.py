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
    # Until a job has been measured, the budget is the honest upper bound of one attempt: saves still
    # get an estimate instead of null.
    default_job_s: float | None = None
    _prompt_tps: float | None = None
    _gen_tps: float | None = None
    _job_s: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, timings: dict[str, Any]) -> None:
        with self._lock:
            pps = timings.get("prompt_per_second")
            gps = timings.get("predicted_per_second")
            if pps and (timings.get("prompt_n") or 0) >= 8:
                self._prompt_tps = _ema(self._prompt_tps, float(pps), self.alpha)
            if gps and (timings.get("predicted_n") or 0) >= 4:
                self._gen_tps = _ema(self._gen_tps, float(gps), self.alpha)

    def observe_job(self, seconds: float) -> None:
        with self._lock:
            self._job_s = _ema(self._job_s, seconds, self.alpha)

    def prompt_tps(self) -> float | None:
        return self._prompt_tps

    def generation_tps(self) -> float | None:
        return self._gen_tps

    def job_seconds(self) -> float | None:
        return self._job_s if self._job_s is not None else self.default_job_s

    def snapshot(self) -> dict[str, float | None]:
        return {
            "prompt_tokens_per_s": round(self._prompt_tps, 1) if self._prompt_tps else None,
            "generation_tokens_per_s": round(self._gen_tps, 1) if self._gen_tps else None,
            "seconds_per_job": round(self._job_s, 2) if self._job_s else None,
        }


def _ema(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new

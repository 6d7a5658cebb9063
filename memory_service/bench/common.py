"""The helpers the benchmarks, the evals and the test suite share, under one name.

Kept for the callers outside bench/ (the test suite's fixtures import ServiceRunner, llama_busy
and AGENT_TEXTS from here); inside bench/ and evals/ each module imports from the one that defines
the name: stats (percentiles, goals), probes (RSS, /metrics, the machine), service_runner (the
service and llama-server processes), report (the shared command line and JSON output), plots
(optional PNGs) and texts (realistic agent texts).
"""

from __future__ import annotations

from .plots import plots_available, pyplot, save_plot, write_figure
from .probes import machine_info, rss_mb, scrape
from .report import main_with_llama, main_without_llama, report, write_json
from .service_runner import ServiceRunner, llama_busy, start_llama, wait_queue_empty
from .stats import goal, latency_summary, ms, percentile
from .texts import AGENT_TEXTS, agent_text

__all__ = [
    "AGENT_TEXTS",
    "ServiceRunner",
    "agent_text",
    "goal",
    "latency_summary",
    "llama_busy",
    "machine_info",
    "main_with_llama",
    "main_without_llama",
    "ms",
    "percentile",
    "plots_available",
    "pyplot",
    "report",
    "rss_mb",
    "save_plot",
    "scrape",
    "start_llama",
    "wait_queue_empty",
    "write_figure",
    "write_json",
]

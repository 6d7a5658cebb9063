"""What a benchmark reads off a running service and the machine under it: RSS, /metrics, load.

Read beside every figure, because on a small shared machine the service's memory and the
machine's load explain a latency as much as the code does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def rss_mb(pid: int) -> dict[str, float | None]:
    """VmRSS (now) and VmHWM (peak) of a service, from /proc (Linux): its process plus its children other
    than a llama-server (the process serving its embedded Chroma store is part of the service). The peak
    is the sum of each process's peak, an upper bound."""
    out: dict[str, float | None] = {"rss_mb": None, "peak_rss_mb": None}
    for one in (pid, *_service_children(pid)):
        try:
            for line in Path(f"/proc/{one}/status").read_text().splitlines():
                for field, key in (("VmRSS:", "rss_mb"), ("VmHWM:", "peak_rss_mb")):
                    if line.startswith(field):
                        out[key] = round((out[key] or 0.0) + int(line.split()[1]) / 1024.0, 1)
        except OSError:
            pass
    return out


def _service_children(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if int(rest[1]) == pid and "llama" not in name:
            children.append(int(stat.parent.name))
    return children


def scrape(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A /metrics page as sample name -> [(labels, value)], read by prometheus_client's own parser
    (a histogram's samples come as NAME_bucket, NAME_sum and NAME_count)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def machine_info() -> dict[str, Any]:
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "loadavg_1_5_15": [round(x, 2) for x in load],
        "python": sys.version.split()[0],
    }
    try:  # which embedder the services started here use: it changes recall latency and RSS a lot
        from ..config import Settings

        info["service_embedder"] = getattr(Settings.from_env(), "embedder", "torch")
    except Exception:
        pass
    return info

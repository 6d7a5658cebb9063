"""Does llama.cpp's anti-repetition sampling (DRY, repeat penalty) help extraction at temperature 0?

Runs the service's own Extractor (loop guard on) over the same texts once per sampling setting, against one
llama-server, and prints per setting: loops stopped, calls cut at the cap, failed texts, facts kept and
rejected by grounding, PersonaExt gold tails found in the kept facts, output tokens and seconds.

    .venv/bin/python scripts/measure_loop_sampling.py [--llm-url URL] [--persona 30] [--locomo 8]

Without --llm-url it starts llama-server on the default model (MEMORY_LLAMA_THREADS threads).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memory_service.bench.texts import AGENT_TEXTS  # noqa: E402
from memory_service.evals import personaext  # noqa: E402
from memory_service.extraction.extractor import Extractor  # noqa: E402
from memory_service.extraction.throughput import Throughput  # noqa: E402
from memory_service.llm.client import LlamaClient  # noqa: E402
from memory_service.ops.doctor_checks import PROBE_TEXTS, probe_extraction  # noqa: E402

DATA = Path("/work/shared/data")
SETTINGS: dict[str, dict[str, Any]] = {
    "none": {},
    "dry": {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2},
    "repeat_penalty": {"repeat_penalty": 1.1, "repeat_last_n": 64},
}


def locomo_chunks(n: int, turns: int = 8) -> list[str]:
    """`n` texts of `turns` chat lines ("Speaker: text") from the dev conversations, one per session."""
    out: list[str] = []
    for conv in json.loads((DATA / "locomo/locomo_dev5.json").read_text()):
        c = conv["conversation"]
        for s in range(1, 40):
            lines = c.get(f"session_{s}")
            if not lines or len(out) >= n:
                continue
            out.append("\n".join(f"{t['speaker']}: {t['text']}" for t in lines[:turns]))
    return out[:n]


async def measure(url: str, name: str, texts: list[tuple[str, str, str | None]], budget_s: float) -> dict[str, Any]:
    client = LlamaClient(url, sampling=SETTINGS[name])
    try:
        props = await client.props()
        extractor = Extractor(client=client, props=props, throughput=Throughput(), max_output_tokens=384)
        row: dict[str, Any] = {"setting": name, "loops": 0, "cut": 0, "failed": 0, "kept": 0, "rejected": 0}
        row.update(persona_found=0, persona_n=0, predicted_n=0)
        started = time.monotonic()
        for kind, text, tail in texts:
            probe = await probe_extraction(extractor, text, budget_s)
            calls = probe.get("calls") or []
            row["loops"] += sum(1 for c in calls if c.get("loop"))
            row["cut"] += sum(1 for c in calls if c.get("finish_reason") == "length")
            row["predicted_n"] += int((probe.get("timings") or {}).get("predicted_n") or 0)
            if not probe["valid"]:
                row["failed"] += 1
                print(f"  {name} {kind} FAILED: {probe['error'][:160]}", flush=True)
                continue
            row["kept"] += len(probe["facts"])
            row["rejected"] += len(probe["rejected"])
            if kind == "persona" and tail:
                row["persona_n"] += 1
                row["persona_found"] += any(personaext.phrase_in(tail, f) for f in probe["facts"])
        row["seconds"] = round(time.monotonic() - started, 1)
        return row
    finally:
        await client.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm-url")
    parser.add_argument("--persona", type=int, default=30)
    parser.add_argument("--locomo", type=int, default=8)
    parser.add_argument("--budget-s", type=float, default=120.0)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    args = parser.parse_args()
    persona = [u for u in personaext.load(DATA / "personaext/dev.jsonl", None) if u.tail][: args.persona]
    texts: list[tuple[str, str, str | None]] = [("probe", t, None) for t in PROBE_TEXTS]
    texts += [("agent", t, None) for t in AGENT_TEXTS[:8]]
    texts += [("locomo", t, None) for t in locomo_chunks(args.locomo)]
    texts += [("persona", u.text, u.tail) for u in persona]
    server = None
    url = args.llm_url
    if not url:
        from memory_service.testbed.service_runner import start_llama

        server = start_llama("default")
        url = server.url
    try:
        for name in args.settings.split(","):
            print(json.dumps(asyncio.run(measure(url, name, texts, args.budget_s))), flush=True)
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The walks: which package files one save or one recall crosses, for a reader following it.

    PYTHONPATH=. .venv/bin/python scripts/walks.py remember   # from the checkout's root; prints JSON
    PYTHONPATH=. .venv/bin/python scripts/walks.py recall

remember: from POST /v1/remember to its job's `done`; recall: one POST /v1/recall with a token budget, over
a few saved and extracted texts. In process, against the fake llama-server, after a warm-up of the same
call; every thread is traced. `files` is how many package files the call enters, `returns` how often a
thread goes back to a file it had left, `folder_returns` the same per top-level folder. A measure of how
the code reads, not of speed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from memory_service.app import create_app
from memory_service.config import Settings
from memory_service.services import Services
from tests.fakes.fake_llama_server import FakeLlamaServer

PACKAGE = str(Path("memory_service").resolve()) + "/"


class Walk:
    """Every package function entered while `recording`, per thread, in order."""

    def __init__(self) -> None:
        self.recording = False
        self.calls: list[tuple[int, str]] = []
        self._lock = threading.Lock()

    def trace(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and self.recording and frame.f_code.co_filename.startswith(PACKAGE):
            with self._lock:
                self.calls.append((threading.get_ident(), frame.f_code.co_filename[len(PACKAGE) :]))

    def returns(self, key: Any) -> int:
        """How often a thread comes back to a file (or folder) it had left."""
        back = 0
        for thread in {t for t, _ in self.calls}:
            seen: set[str] = set()
            previous = None
            for _, name in (c for c in self.calls if c[0] == thread):
                place = key(name)
                if place != previous:
                    back += place in seen
                    seen.add(place)
                    previous = place
        return back


async def _save_and_wait(client: httpx.AsyncClient, walk: Walk, text: str) -> str:
    walk.recording = True
    answer = await client.post("/v1/remember", json={"agent_id": "a", "text": text})
    memory_id = answer.json()["id"]
    status = "queued"
    for _ in range(600):
        walk.recording = False  # looking at the job is not the walk
        status = (await client.get(f"/v1/memories/{memory_id}")).json()["status"]
        walk.recording = True
        if status in ("done", "failed"):
            break
        await asyncio.sleep(0.05)
    walk.recording = False
    return status


async def _recall(client: httpx.AsyncClient, walk: Walk, query: str) -> str:
    walk.recording = True
    answer = await client.post("/v1/recall", json={"query": query, "k": 10, "max_tokens": 128})
    walk.recording = False
    return "done" if answer.status_code == 200 and answer.json()["items"] else f"{answer.status_code} {answer.text}"


async def main(which: str) -> dict[str, Any]:
    walk = Walk()
    threading.settrace(walk.trace)  # type: ignore[arg-type]  # the global trace function's return is unused
    sys.settrace(walk.trace)  # type: ignore[arg-type]
    with FakeLlamaServer("ok", tokens_per_s=5000) as fake:
        settings = Settings(data_dir=Path(tempfile.mkdtemp()) / "data", llm_url=fake.url)
        services = Services.open(settings)
        app = create_app(settings, services=services)
        await services.start()
        transport = httpx.ASGITransport(app=app)  # a keyless service answers only a loopback host
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            await _save_and_wait(client, Walk(), "Warm up: Ana fixed the build.")  # first-call costs are not the walk
            if which == "remember":
                status = await _save_and_wait(
                    client, walk, "Rosa Diaz closed incident 42 on the payments gateway on Monday."
                )
            else:
                await _save_and_wait(client, Walk(), "Rosa Diaz closed incident 42 on the payments gateway.")
                await _recall(client, Walk(), "who fixed the build?")
                status = await _recall(client, walk, "who closed incident 42?")
        await services.stop()
    sys.settrace(None)
    threading.settrace(None)  # type: ignore[arg-type]
    files = sorted({name for _, name in walk.calls})
    return {
        "status": status,
        "files": len(files),
        "returns": walk.returns(lambda name: name),
        "folder_returns": walk.returns(lambda name: name.split("/")[0]),
        "threads": len({t for t, _ in walk.calls}),
        "list": files,
    }


if __name__ == "__main__":
    if sys.argv[1:] not in (["remember"], ["recall"]):
        sys.exit("usage: scripts/walks.py remember|recall")
    print(json.dumps(asyncio.run(main(sys.argv[1])), indent=1))

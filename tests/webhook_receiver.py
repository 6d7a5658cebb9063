"""A webhook receiver for the tests: a real HTTP server on a real loopback port that checks each delivery's
signature with the snippet docs/webhooks.md gives receivers (read from the doc, not imported from the service)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def _doc_snippet() -> Callable[..., bool]:
    """The receiver's check exactly as docs/webhooks.md prints it: the tests verify with the documented code."""
    text = (Path(__file__).parent.parent / "docs" / "webhooks.md").read_text()
    code = next(body for body in re.findall(r"^```python\n(.*?)^```", text, re.M | re.S) if "def verify" in body)
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/webhooks.md", "exec"), scope)
    return scope["verify"]


verify = _doc_snippet()


class Receiver:
    """Records every POST; answers `status` (200 unless a test says otherwise). `secret` set: keeps only the
    deliveries whose signature verifies within `tolerance_s`, and answers the others 401 (as the doc tells
    receivers to) and counts them in `forged`."""

    def __init__(self, port: int = 0) -> None:
        self.secret: str | None = None
        self.tolerance_s = 300
        self.status = 200
        self.events: list[dict[str, Any]] = []
        self.raw: list[tuple[dict[str, str], bytes]] = []
        self.forged = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver.lock:
                    receiver.raw.append((headers, body))
                    status = receiver.status
                    if status < 300:
                        secret = receiver.secret
                        if secret is None or verify(secret, headers, body, tolerance_s=receiver.tolerance_s):
                            receiver.events.append(json.loads(body) | {"_headers": headers})
                        else:
                            receiver.forged += 1
                            status = 401
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def of(self, event: str) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.events if e["type"] == event]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

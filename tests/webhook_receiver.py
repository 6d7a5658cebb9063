"""A webhook receiver for the tests: a real HTTP server on a real loopback port that checks each delivery's
signature as docs/webhooks.md tells a receiver to, written here from the doc, not imported from the service."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def verify(secret: str, headers: dict[str, str], body: bytes, tolerance_s: float = 300) -> bool:
    """The receiver's check from docs/webhooks.md: HMAC-SHA256 over "<timestamp>.<body>", a recent timestamp."""
    timestamp = headers.get("x-memory-timestamp", "")
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    fresh = timestamp.isdigit() and abs(time.time() - int(timestamp)) <= tolerance_s
    return fresh and hmac.compare_digest(expected, headers.get("x-memory-signature", ""))


class Receiver:
    """Records every POST; answers `status` (200 unless a test says otherwise). `secret` set: keeps only the
    deliveries whose signature verifies, and counts the others in `forged`."""

    def __init__(self, port: int = 0) -> None:
        self.secret: str | None = None
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
                        if receiver.secret is None or verify(receiver.secret, headers, body):
                            receiver.events.append(json.loads(body) | {"_headers": headers})
                        else:
                            receiver.forged += 1
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

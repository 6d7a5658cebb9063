"""No outbound call but to the llama-server and Chroma: environment variables meant for other apps'
telemetry neither switch ours on nor stop the service from starting."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from memory_service.llm.runtime.server import free_port

pytestmark = pytest.mark.process  # the environment of a serve subprocess


class _Collector(BaseHTTPRequestHandler):
    received: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.received.append(self.path)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_opentelemetry_variables_in_the_environment_send_nothing(service_factory):
    collector = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{collector.server_address[1]}"
    try:
        svc = service_factory(
            f"http://127.0.0.1:{free_port()}",
            env={
                # what a host set up for other apps' tracing may hold: FastAPI's switch for its own exporters
                "FASTAPI_OTEL_AUTO_CONFIGURE": "true",
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_METRIC_EXPORT_INTERVAL": "200",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
                "OTEL_BLRP_SCHEDULE_DELAY": "100",
            },
        )
        with svc.client() as client:
            for n in range(5):
                assert client.post("/v1/remember", json={"text": f"note {n}", "agent_id": "a"}).status_code == 202
            assert client.post("/v1/recall", json={"query": "note"}).status_code == 200
            assert client.post("/v1/recall", json={"query": ""}).status_code == 422  # an error path too
        svc.stop()  # exporters flush at shutdown
        assert _Collector.received == []
    finally:
        collector.shutdown()

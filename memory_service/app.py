"""The service's HTTP app: the API (`api/`) with the operator's console (`console/`) mounted at /ui.

Composed here, above both, so the API never imports the console and the console may use the API's auth,
errors and cursors (the `layers` import contract). `serve` builds this app; `serve --workers` has each
worker build it through `worker_app`.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI

from . import console
from .api.app import create_api
from .config import Settings, worker_speed_prior
from .services import Services


def create_app(
    settings: Settings,
    *,
    speed_prior: tuple[float, float] | None = None,
    services: Services | None = None,
    run_workers: bool = False,
) -> FastAPI:
    """The API (`api.app.create_api`, same arguments) and the console at /ui, on the same keys and stores."""
    app = create_api(settings, speed_prior=speed_prior, services=services, run_workers=run_workers)
    console.mount(app)
    return app


def worker_app() -> FastAPI:
    """The app factory uvicorn calls in each worker of `serve --workers` (`api/workers.py`)."""
    from .logs import configure as configure_logging

    settings = Settings.from_env()
    configure_logging(settings.log_format, settings.log_level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # as `main` sets it in the parent: no line per request
    return create_app(settings, speed_prior=worker_speed_prior())

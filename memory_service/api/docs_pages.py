"""`/docs` (Swagger UI) and `/redoc` (ReDoc), served whole by the service: the project makes no outbound call.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so they were blank offline. The assets here are the
ones the fastapi-offline wheel ships (its factory is not used: the app is built by `create_app`). A Content
Security Policy keeps the pages on this origin: ReDoc's sidebar asks a CDN for a logo, which the browser then
never requests.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

ASSETS = "/docs-assets"
# inline: Swagger UI's start script and both pages' injected styles; blob: ReDoc's search worker
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)


def _offline(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CSP
    return page


def install(app: FastAPI) -> None:
    """Mount the assets and add the two pages (out of the schema, like FastAPI's own)."""
    app.mount(ASSETS, StaticFiles(directory=str(files("fastapi_offline") / "static")), name="docs-assets")
    openapi = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return _offline(
            get_swagger_ui_html(
                openapi_url=f"{root}{openapi}",
                title=f"{app.title} - Swagger UI",
                swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
                swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
                swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
                swagger_ui_parameters=app.swagger_ui_parameters,
            )
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return _offline(
            get_redoc_html(
                openapi_url=f"{root}{openapi}",
                title=f"{app.title} - ReDoc",
                redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
                redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
                with_google_fonts=False,
            )
        )

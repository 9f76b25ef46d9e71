"""``/docs``: Swagger UI for the API's OpenAPI document, served from the package's own copy
(``api/static/swagger``, fetched by ``scripts/vendor-web``), so it works on a machine without
internet. Its *Authorize* button takes an API key (the document declares the bearer scheme),
and keeps it across reloads of the page in that browser.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

STATIC = Path(__file__).resolve().parent / "static"
SWAGGER = "/static/swagger"


def serve_docs(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=f"{SWAGGER}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER}/swagger-ui.css",
            swagger_favicon_url=f"{SWAGGER}/favicon-32x32.png",
            swagger_ui_parameters={"persistAuthorization": True},
        )

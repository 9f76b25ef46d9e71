"""``/docs``: Swagger UI for the API's OpenAPI document, served from the package's own copy
(``api/static/swagger``, fetched by ``scripts/vendor-web``), so it works on a machine without
internet. Its *Authorize* button takes an API key (the document declares the bearer scheme)
for that page only: the key is not kept in the browser's storage, where any script of the
origin could read it later. The page runs no inline script (its start is
``api/static/docs/init.js``), so its Content-Security-Policy forbids any (api/headers.py).
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

STATIC = Path(__file__).resolve().parent / "static"
SWAGGER = "/static/swagger"


def serve_docs(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(docs_page(app.openapi_url or "/openapi.json", f"{app.title} API"))


def docs_page(openapi_url: str, title: str) -> str:
    """The HTML of /docs: Swagger UI's files and its start, all from /static."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{escape(title)}</title>
<link rel="stylesheet" href="{SWAGGER}/swagger-ui.css">
<link rel="icon" href="{SWAGGER}/favicon-32x32.png">
</head>
<body data-openapi="{escape(openapi_url)}">
<div id="swagger-ui"></div>
<script src="{SWAGGER}/swagger-ui-bundle.js"></script>
<script src="/static/docs/init.js"></script>
</body>
</html>
"""

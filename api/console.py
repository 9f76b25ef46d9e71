"""``/console``: the operators' console, a page of the package's own files (no CDN, works
offline) that signs in with an API key and talks to the JSON API like any other client, so it
shows nothing the API does not (docs/design.md §9). Plain HTML and JavaScript with no build
step: ``api/static/console``.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.responses import FileResponse

from api.docs import STATIC

PAGE = STATIC / "console" / "index.html"


def serve_console(app: FastAPI) -> None:
    @app.get("/console", include_in_schema=False)
    async def console() -> FileResponse:
        # The page holds no data: everything comes from the API with the signed-in key.
        return FileResponse(PAGE, headers={"Cache-Control": "no-cache"})

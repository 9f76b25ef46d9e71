"""The Swagger UI files /docs serves are the pinned release, whole (scripts/vendor-web)."""

from __future__ import annotations

import hashlib

from api.docs import STATIC


def test_the_vendored_swagger_ui_matches_its_manifest() -> None:
    folder = STATIC / "swagger"
    lines = (folder / "MANIFEST.sha256").read_text().splitlines()
    assert {line.split()[1] for line in lines} >= {"swagger-ui-bundle.js", "swagger-ui.css"}
    for line in lines:
        digest, name = line.split()
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name

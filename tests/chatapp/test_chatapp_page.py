"""GET /: the chat page and its static files, all served by the app (no CDN)."""

from __future__ import annotations

import re

from flask.testing import FlaskClient


def test_page_and_assets(client: FlaskClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.mimetype == "text/html"
    html = response.get_data(as_text=True)
    assert '<label for="prompt"' in html
    assert 'aria-live="polite"' in html
    assert 'id="stop"' in html and 'id="new-chat"' in html
    assert 'data-max-request-bytes="65536"' in html
    assert 'data-max-new-tokens-limit="4096"' in html
    assets = [link for link in re.findall(r'(?:src|href)="([^"]+)"', html) if link[0] != "#"]
    assert assets, "the page links its script and stylesheet"
    for asset in assets:
        assert asset.startswith("/static/"), f"{asset} is not served by the app"
        with client.get(asset) as asset_response:
            assert asset_response.status_code == 200


def test_script_never_renders_model_output_as_html(client: FlaskClient) -> None:
    scripts = {}
    for name in ("chat.js", "markdown.js", "store.js"):  # the page's own modules
        with client.get(f"/static/{name}") as response:
            scripts[name] = response.get_data(as_text=True)
    for script in scripts.values():
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in script
    script = scripts["chat.js"]
    assert "TextDecoder" in script and "stream: true" in script
    assert "AbortController" in script
    # Markdown becomes DOM only through the sanitiser, as a fragment.
    assert "DOMPurify.sanitize(html, SANITIZE)" in scripts["markdown.js"]
    assert "RETURN_DOM_FRAGMENT: true" in scripts["markdown.js"]


def test_security_headers(client: FlaskClient) -> None:
    response = client.get("/")
    policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert "style-src 'self'" in policy and "unsafe" not in policy
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert client.get("/nope").headers["X-Content-Type-Options"] == "nosniff"

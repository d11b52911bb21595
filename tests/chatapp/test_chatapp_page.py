"""GET /: the chat page and its static files, all served by the app (no CDN)."""

from __future__ import annotations

import re
from pathlib import Path

from flask.testing import FlaskClient

from tests.test_import_cycles import cycles

STATIC = Path(__file__).resolve().parents[2] / "main-app" / "chatapp" / "static"


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


def page_modules(client: FlaskClient) -> dict[str, str]:
    """The page's own ES modules, as the browser finds them: chat.js and what it imports,
    transitively (the vendored libraries aside)."""
    found: dict[str, str] = {}
    pending = ["chat.js"]
    while pending:
        name = pending.pop()
        with client.get(f"/static/{name}") as response:
            assert response.status_code == 200, name
            assert response.mimetype == "text/javascript", name  # a module needs a JS type
            found[name] = response.get_data(as_text=True)
        for imported in re.findall(
            r'^\s*(?:import|export)\b[^;]*?from "\./([^"]+)"', found[name], re.M
        ):
            if imported not in found and not imported.startswith("vendor/"):
                pending.append(imported)
    return found


def test_the_page_is_es_modules_served_as_they_are(client: FlaskClient) -> None:
    modules = page_modules(client)
    assert {"chat.js", "exchange.js", "markdown.js", "store.js"} <= set(modules)
    own = {p.name for p in STATIC.glob("*.js")}
    assert set(modules) == own, "every module in static/ is loaded by the page, and only those"


def test_the_page_modules_import_no_cycle(client: FlaskClient) -> None:
    graph = {
        name: set(re.findall(r'from "\./([^"/]+\.js)"', text))
        for name, text in page_modules(client).items()
    }
    assert graph["chat.js"] and not cycles(graph), cycles(graph)


def test_script_never_renders_model_output_as_html(client: FlaskClient) -> None:
    scripts = page_modules(client)
    for script in scripts.values():
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in script
    script = scripts["exchange.js"]  # reads the reply stream
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

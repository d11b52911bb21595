"""`GET /`: the chat page (HTML, CSS and JavaScript served from this package, no CDN).

The page's script (`static/chat.js` and the modules it imports) renders replies as Markdown
with the libraries vendored under `static/vendor/` (see `scripts/vendor_static.py`), always
through an allow-list sanitiser, and keeps chats and settings in the browser's localStorage
(the images of a chat in its IndexedDB, `static/image-store.js`); for a signed-in user
(`GET /api/me`, chatapp/chats/api.py) it keeps chats on the server instead
(`static/server-chats.js`) and offers the browser's own chats for import once
(`static/import-chats.js`).

Every response also gets headers that keep a browser from doing anything the page does not
need: the page loads only its own script, style and icon, and model output that somehow ended
up as markup could not run a script.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, render_template

bp = Blueprint("pages", __name__)

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        # blob: the images a person attaches, shown from memory (static/images.js); the
        # Markdown sanitiser lets no image into a reply whatever this allows.
        "img-src 'self' blob:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)


@bp.get("/")
def index() -> str:
    return render_template(
        "chat/index.html",
        max_request_bytes=current_app.config["MAX_CONTENT_LENGTH"],
        max_messages=current_app.config["MAX_MESSAGES"],
        max_new_tokens_limit=current_app.config["MAX_NEW_TOKENS_LIMIT"],
        max_image_bytes=current_app.config["MAX_IMAGE_BYTES"],
        max_images=current_app.config["MAX_IMAGES"],
    )


@bp.after_app_request
def security_headers(response: Response) -> Response:
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    return response

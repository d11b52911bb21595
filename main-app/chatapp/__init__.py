"""The chat app: a Flask page that relays conversations to the Phi-3 sidecar and streams replies.

`create_app(test_config=None)` builds it: defaults from `chatapp.settings`, then the
environment, then `test_config`. Production runs `chatapp.wsgi:app` under gunicorn
(`chatapp.gunicorn_conf`); `python -m chatapp` runs Flask's development server.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flask import Flask

    from chatapp.relay.upstream import Upstream
    from chatapp.store import Store


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    # Imported here, not at the top: gunicorn's config reads chatapp.settings in the master
    # process, and Flask, requests and urllib3 must load only after the gevent worker has
    # patched the standard library (sockets, ssl, threads).
    from flask import Flask

    from chatapp import accounts, errors, health, pages, settings
    from chatapp.accounts import cross_site
    from chatapp.chats import api as chats_api
    from chatapp.documents import routes as documents_routes
    from chatapp.documents.service import Documents
    from chatapp.guards.body_deadline import BodyDeadline
    from chatapp.guards.host import AllowedHosts, allowed
    from chatapp.guards.uploads import LargeBodies
    from chatapp.observability import metrics
    from chatapp.observability.telemetry import Telemetry
    from chatapp.relay import chat as relay
    from chatapp.relay import model_list
    from chatapp.speech import routes as speech_routes

    app = Flask(__name__)
    # "//" in a path is a 404, not a redirect: Werkzeug would redirect to a URL built from the
    # Host header, which a client can forge (GET /static//chat.js, Host: evil.example).
    app.url_map.merge_slashes = False
    app.config.from_mapping(settings.DEFAULTS)
    app.config.from_mapping(settings.from_environ(os.environ))
    if test_config is not None:
        app.config.from_mapping(test_config)

    app.extensions["upstream"] = upstream = _make_upstream(app.config)
    # The chat models it serves, for the page's picker (GET /api/models), briefly kept.
    app.extensions["model_list"] = model_list.ModelList(upstream)
    accounts.install(app)
    app.extensions["store"] = store = _open_store(app.config)
    _keep_chats_for(app, store)
    # The library (chatapp/documents/): its search, and its indexer where it runs in-process.
    app.extensions["documents"] = Documents(store, app.config)
    # A request body must arrive within REQUEST_BODY_TIMEOUT (guards/body_deadline.py); one
    # with images may be larger than a text's (relay/images.py), a few at once
    # (guards/uploads.py).
    largest = speech_routes.largest_body(app.config)
    app.wsgi_app = BodyDeadline(  # type: ignore[method-assign]
        app.wsgi_app,
        app.config["REQUEST_BODY_TIMEOUT"],
        largest,  # a chat's, an import's, or a recording's
    )
    app.wsgi_app = LargeBodies(  # type: ignore[method-assign]
        app.wsgi_app, app.config["MAX_CONTENT_LENGTH"], app.config["MAX_IMAGE_CHATS"]
    )
    # Outermost: a name the app is not meant to be reached by runs nothing (DNS rebinding).
    app.wsgi_app = AllowedHosts(app.wsgi_app, allowed(app.config))  # type: ignore[method-assign]
    # /metrics, and traces when a destination is configured (chatapp/observability/telemetry.py).
    app.extensions["telemetry"] = telemetry = Telemetry.from_config(app.config)
    telemetry.install(app)
    errors.install(app)
    cross_site.install(app)
    app.register_blueprint(pages.bp)
    app.register_blueprint(relay.bp)
    app.register_blueprint(model_list.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(chats_api.bp)
    app.register_blueprint(documents_routes.bp)
    app.register_blueprint(speech_routes.bp)
    if app.config["METRICS"]:
        app.register_blueprint(metrics.bp)
    return app


def _open_store(config: Mapping[str, Any]) -> Store:
    """The database DATABASE_URL names (else the SQLite file in DATA_DIR), migrated to the
    newest revision: here, in each worker, under a lock that makes it happen once
    (chatapp/store/migrate.py)."""
    from chatapp.store import Store, migrate
    from chatapp.store.database import default_url

    store = Store.open(config["DATABASE_URL"] or default_url(config["DATA_DIR"]))
    migrate.upgrade(store.engine)
    return store


def _keep_chats_for(app: Flask, store: Store) -> None:
    """CHAT_RETENTION_DAYS: a sweep now, then at most hourly from a request
    (chatapp/store/retention.py)."""
    from chatapp.store.retention import Retention

    retention = Retention(store, app.config["CHAT_RETENTION_DAYS"])
    app.extensions["retention"] = retention
    if app.config["CHAT_RETENTION_DAYS"]:
        retention.maybe_sweep()

        def sweep() -> None:
            retention.maybe_sweep()

        app.before_request(sweep)


def _make_upstream(config: Mapping[str, Any]) -> Upstream:
    """The upstream the app's config asks for (chatapp.settings: UPSTREAM_API, SIDECAR_URL)."""
    from chatapp.relay.upstream import Connection
    from chatapp.relay.upstream_openai import OpenAIUpstream
    from chatapp.relay.upstream_predict import PredictUpstream

    connection = Connection(
        config["SIDECAR_URL"],
        connect_timeout=config["SIDECAR_CONNECT_TIMEOUT"],
        # No wait for the model service outlasts the chat's own limit (relay/stream.py).
        read_timeout=min(config["SIDECAR_READ_TIMEOUT"], config["RELAY_TIME_LIMIT"]),
        api_key=config["UPSTREAM_API_KEY"],
    )
    if config["UPSTREAM_API"] == "openai":
        return OpenAIUpstream(connection, config["UPSTREAM_MODEL"], config["UPSTREAM_SPEECH_MODEL"])
    return PredictUpstream(connection)

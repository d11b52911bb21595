"""The library's HTTP routes (docs/api.md, "Documents"). Every route acts for the request's
owner (`owner.current_owner_id`); another owner's document is 404, as one that never was.

    POST   /api/documents        multipart, one or more `file` fields -> 202
                                 {"documents": [{"id", "name", "status"}]}
    GET    /api/documents        {"documents": [{"id", "name", "status", "progress", "chunks",
                                 "error"}]}
    GET    /api/documents/<id>   one of those
    DELETE /api/documents/<id>   204; its passages leave search at once
    POST   /api/documents/<id>/cancel, /retry   the document as GET shows it
    POST   /api/search           {"query", "k"} -> {"results": [{"document_id", "name", "text",
                                 "page", "score"}]} best first

A database too busy to take a write in time (SQLite's one writer, past its busy timeout) is
503 `busy` with Retry-After, never a 500: the request may simply be sent again (an upload
sent again finds the files it already stored by their hash).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from sqlalchemy.exc import OperationalError

from chatapp.documents import library
from chatapp.documents.embedder import EmbeddingsFailed
from chatapp.documents.models import Document
from chatapp.documents.owner import current_owner_id
from chatapp.documents.reading.formats import Limits
from chatapp.documents.search.retrieval import Searcher
from chatapp.errors import ApiError, error_response
from chatapp.guards.uploads import FULL
from chatapp.relay.images import body_limit
from chatapp.store import current_store
from chatapp.store.database import busy

bp = Blueprint("documents", __name__)

MAX_K = 50
MAX_QUERY_CHARS = 2000
BUSY_RETRY_AFTER_S = 2


def limits() -> Limits:
    config = current_app.config
    return Limits(config["DOCUMENT_MAX_BYTES"], config["DOCUMENT_MAX_PAGES"])


def shown(document: Document, *, brief: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"id": document.id, "name": document.name, "status": document.status}
    if not brief:
        body.update(progress=document.progress, chunks=document.chunks)
        body["error"] = (
            None
            if document.error_type is None
            else {"type": document.error_type, "message": document.error}
        )
    return body


@bp.post("/api/documents")
def upload() -> tuple[Response, int]:
    if request.environ.get(FULL):
        raise ApiError(
            "busy", "Too many uploads at once; try again shortly.", status=503, retry_after=2
        )
    if not (request.content_type or "").startswith("multipart/form-data"):
        raise ApiError(
            "unsupported_media_type",
            "Send the files as multipart/form-data, each in a `file` field.",
            status=415,
        )
    owner_id = current_owner_id()  # who is asking before the body is read: a 401 first
    # The app's body limit is a chat's (MAX_REQUEST_BYTES); an upload may be as large as the
    # body the app reads at all (BodyDeadline's bound, images.body_limit), files together.
    request.max_content_length = body_limit(current_app.config)
    files = request.files.getlist("file")
    if not files:
        raise ApiError("no_files", "Send one or more files in `file` fields.", status=400)
    if len(files) > current_app.config["DOCUMENT_MAX_FILES"]:
        raise ApiError(
            "too_many_files",
            f"Send at most {current_app.config['DOCUMENT_MAX_FILES']}"
            " files at once (DOCUMENT_MAX_FILES).",
            status=413,
        )
    added = []
    for file in files:
        # One past the limit is enough to know it is too large, without reading the rest.
        data = file.stream.read(current_app.config["DOCUMENT_MAX_BYTES"] + 1)
        result = library.add(
            current_store(), owner_id, file.filename or "untitled", data, file.mimetype, limits()
        )
        added.append(shown(result.document, brief=True))
    current_app.extensions["documents"].wake()
    return jsonify({"documents": added}), 202


@bp.get("/api/documents")
def listing() -> Response:
    documents = library.listing(current_store(), current_owner_id())
    return jsonify({"documents": [shown(document) for document in documents]})


@bp.get("/api/documents/<int:document_id>")
def one(document_id: int) -> Response:
    return jsonify(shown(_found(library.get(current_store(), current_owner_id(), document_id))))


@bp.delete("/api/documents/<int:document_id>")
def delete(document_id: int) -> tuple[str, int]:
    if not library.delete_document(current_store(), current_owner_id(), document_id):
        _found(None)
    return "", 204


@bp.post("/api/documents/<int:document_id>/cancel")
def cancel(document_id: int) -> Response:
    return jsonify(shown(_found(library.cancel(current_store(), current_owner_id(), document_id))))


@bp.post("/api/documents/<int:document_id>/retry")
def retry(document_id: int) -> Response:
    document = _found(library.retry(current_store(), current_owner_id(), document_id))
    current_app.extensions["documents"].wake()
    return jsonify(shown(document))


@bp.post("/api/search")
def search() -> Response:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise ApiError("invalid_request", 'Send JSON: {"query": "...", "k": 5}.', status=400)
    query, k = body.get("query"), body.get("k", 5)
    if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY_CHARS:
        raise ApiError(
            "invalid_query",
            f"`query` must be text of 1 to {MAX_QUERY_CHARS} characters.",
            status=400,
        )
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ApiError("invalid_k", f"`k` must be a whole number from 1 to {MAX_K}.", status=400)
    searcher: Searcher = current_app.extensions["documents"].searcher
    try:
        passages = searcher.search(current_owner_id(), query, k)
    except EmbeddingsFailed as failed:
        raise ApiError("embeddings_failed", str(failed), status=502) from None
    return jsonify(
        {
            "results": [
                {
                    "document_id": p.document_id,
                    "name": p.name,
                    "text": p.text,
                    "heading": p.heading,
                    "page": p.page,
                    "score": p.score,
                }
                for p in passages
            ]
        }
    )


@bp.errorhandler(OperationalError)
def _database_error(error: OperationalError) -> Response:
    if busy(error):
        headers = {"Retry-After": str(BUSY_RETRY_AFTER_S)}
        message = "The library is busy storing other files; try again shortly."
        return error_response(503, message, "busy", headers)
    # Anything else as the app answers an unexpected error (chatapp/errors.py).
    current_app.logger.exception("unhandled error")
    return error_response(500, "Something went wrong in the chat app.", "internal_error")


def _found(document: Document | None) -> Document:
    if document is None:
        raise ApiError("not_found", "There is no such document in your library.", status=404)
    return document

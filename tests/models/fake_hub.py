"""A local stand-in for the Hugging Face Hub's HTTP API, enough for snapshot_download.

Serves one model repository from a folder on disk (files under `subfolder/`) and answers
404s with the Hub's `X-Error-Code` headers for unknown repos, revisions and paths. Point the
client at it with HF_ENDPOINT=fake.url.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repo_id: str, files: dict[str, bytes]) -> None:
        self.repo_id = repo_id
        self.files = files  # path in repo -> content
        self.downloads: list[str] = []  # paths served by GET .../resolve/...
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hub.answer(self, body=True)

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @classmethod
    def from_folder(cls, repo_id: str, folder: Path, subfolder: str) -> FakeHub:
        files = {f"{subfolder}/{p.name}": p.read_bytes() for p in sorted(folder.iterdir())}
        return cls(repo_id, files | {"README.md": b"# fake\n"})

    def __enter__(self) -> FakeHub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, req: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(req.path).path)
        api = f"/api/models/{self.repo_id}/"
        if path.startswith(f"/{self.repo_id}/resolve/"):
            rev, _, name = path.removeprefix(f"/{self.repo_id}/resolve/").partition("/")
            if name not in self.files:
                return self.error(req, 404, "EntryNotFound")
            if body:
                self.downloads.append(name)
            return self.send(req, self.files[name], body, raw=True)
        if not path.startswith(api):
            return self.error(req, 404, "RepoNotFound")
        kind, _, rest = path.removeprefix(api).partition("/")
        rev, _, folder = rest.partition("/")
        if rev not in ("main", COMMIT):
            return self.error(req, 404, "RevisionNotFound")
        if kind == "revision":
            siblings = [{"rfilename": name} for name in self.files]
            info = {"id": self.repo_id, "sha": COMMIT, "siblings": siblings}
            return self.send(req, json.dumps(info).encode(), body)
        if kind == "tree":
            entries = self.tree(folder.strip("/"), "recursive=true" in req.path.lower())
            if entries is None:
                return self.error(req, 404, "EntryNotFound")
            return self.send(req, json.dumps(entries).encode(), body)
        return self.error(req, 404, "RepoNotFound")

    def tree(self, folder: str, recursive: bool) -> list[dict[str, Any]] | None:
        prefix = f"{folder}/" if folder else ""
        entries: dict[str, dict[str, Any]] = {}
        for name, data in self.files.items():
            if not name.startswith(prefix):
                continue
            rest = name.removeprefix(prefix)
            if "/" in rest and not recursive:
                sub = prefix + rest.split("/")[0]
                entries[sub] = {"type": "directory", "path": sub, "oid": "0" * 40, "size": 0}
            else:
                oid = hashlib.sha1(data).hexdigest()
                entries[name] = {"type": "file", "path": name, "oid": oid, "size": len(data)}
        return list(entries.values()) if entries or not folder else None

    @staticmethod
    def send(req: BaseHTTPRequestHandler, data: bytes, body: bool, raw: bool = False) -> None:
        req.send_response(200)
        req.send_header("Content-Length", str(len(data)))
        req.send_header("Content-Type", "application/octet-stream" if raw else "application/json")
        req.send_header("X-Repo-Commit", COMMIT)
        req.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        req.end_headers()
        if body:
            req.wfile.write(data)

    @staticmethod
    def error(req: BaseHTTPRequestHandler, status: int, code: str) -> None:
        data = json.dumps({"error": code}).encode()
        req.send_response(status)
        req.send_header("X-Error-Code", code)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

"""GET /healthz: always 200 while the app runs, with the sidecar's readiness in the body."""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask
from flask.testing import FlaskClient

from chatapp.documents.index.search_index import index_for
from tests.chatapp.documents.index.test_documents_index import unit
from tests.chatapp.documents.test_documents_encoder_check import Encoder
from tests.chatapp.fake_sidecar import FakeSidecar


def test_ready_sidecar(client: FlaskClient, fake: FakeSidecar) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {
        "status": "ok",
        "model": None,
        "sidecar": {
            "reachable": True,
            "ready": True,
            "detail": {"ready": True, "phase": "ready", "phase_seconds": 1.0, "model": None},
        },
        # the fake lists a chat model only: passages by the byte bound, said (sizing.py)
        "documents": {
            "passages": {
                "counted_by": "byte_bound",
                "max_tokens": 256,
                "reason": "the model service lists no encoder",
            },
            "encoder": {"state": "unknown"},  # no vector yet
        },
    }


def test_the_sidecars_failure_reason_stays_out_of_the_public_health(
    client: FlaskClient, fake: FakeSidecar
) -> None:
    """The reason can name the model's folder or a library's error: the sidecar's log and its
    own /readyz (not published) say it; the page needs only the phase."""
    reason = "onnxruntime-genai could not load the model in '/home/models/x': bad graph"
    body = {"ready": False, "phase": "failed", "reason": reason, "phase_seconds": 3.0}
    fake.readyz = (503, body)
    answer = client.get("/healthz").get_json()
    assert answer["sidecar"]["detail"] == {"ready": False, "phase": "failed", "phase_seconds": 3.0}
    assert "/home/models" not in str(answer) and "onnxruntime" not in str(answer)


def test_loading_sidecar(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.readyz = (503, {"status": "loading", "phase": "loading"})
    body = client.get("/healthz").get_json()
    assert body["sidecar"]["reachable"] is True
    assert body["sidecar"]["ready"] is False
    assert body["sidecar"]["detail"]["phase"] == "loading"


def test_sidecar_down(make_app: Callable[..., Flask], down_url: str) -> None:
    response = make_app(SIDECAR_URL=down_url).test_client().get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {
        "status": "ok",
        "model": None,
        "sidecar": {"reachable": False, "ready": False},
        "documents": {
            "passages": {
                "counted_by": "byte_bound",
                "max_tokens": 256,
                "reason": "the model service is not reachable",
            },
            "encoder": {"state": "unknown"},
        },
    }


def test_model_name_from_the_sidecar(client: FlaskClient, fake: FakeSidecar) -> None:
    fake.readyz = (200, {"phase": "ready", "model": " Phi-3-mini-4k-instruct "})
    assert client.get("/healthz").get_json()["model"] == "Phi-3-mini-4k-instruct"
    fake.readyz = (503, {"status": "loading", "phase": "loading", "model": 7})
    assert client.get("/healthz").get_json()["model"] is None


def test_the_librarys_encoder_same_or_changed_with_the_remedy(app: Flask) -> None:
    """`documents.encoder`: whether the encoder served is the one the library's vectors were
    made with (its probe's vector, documents/encoder_check.py)."""
    store = app.extensions["store"]
    with store.session(write=True) as session:
        index_for(store).prepare(session, 8, unit(1.0))
    check = app.extensions["documents"].searcher.encoder
    check.embedder = same = Encoder(unit(1.0))

    def healthz() -> dict[str, str]:
        documents: dict[str, dict[str, str]] = (
            app.test_client().get("/healthz").get_json()["documents"]
        )
        return documents["encoder"]

    assert healthz() == {"state": "unknown"}  # no search yet: /healthz asks nothing itself
    assert same.asked == []
    check.state(store)  # what a search checks first
    assert healthz() == {"state": "same"}
    check.embedder = Encoder(unit(0.0, 1.0))  # another encoder of the same width ...
    check.forget()  # ... noticed at the next search's probe (within a minute)
    check.state(store)
    encoder = healthz()
    assert encoder["state"] == "changed"
    assert "python -m chatapp.documents reembed" in encoder["remedy"]
    probes = len(same.asked)
    healthz()
    assert len(same.asked) == probes

"""Images through the real sidecar on the tiny TEXT model (issue 36): every hostile image gets
its 400 from the web process and the model worker never sees it (its pid stays the same); a
valid image gets the capability's 400, naming the model, on every route and through the
official `openai` SDK; the body bound lets images through and keeps text-only bodies small;
/readyz, /v1/models, usage, the log line and /metrics say what they should. The replies to
images are tests/sidecar/web/images/test_sidecar_images_vision.py's, on the tiny vision model."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from PIL import Image

from scripts.run import services
from scripts.run.services import Service
from sidecar.web.images.decoding import url_chars
from tests.sidecar.support import assert_error, metrics, predict, request_line
from tests.sidecar.web.generation.test_sidecar_faults import model_worker
from tests.sidecar.web.images.image_files import (
    chat_body,
    data_url,
    encoded,
    image_part,
    jpeg,
    png,
)
from tests.sidecar.web.images.test_sidecar_images import HOSTILE

CHAT = "/v1/chat/completions"


def post(service: Service, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(service.url + path, json=body, headers=headers, timeout=60)


def test_each_hostile_image_gets_its_400_and_never_reaches_the_worker(
    sidecar_service: Service,
) -> None:
    worker = model_worker(sidecar_service)
    got = {}
    for name, (make, reason, _) in HOSTILE.items():
        url = make()
        chat = post(sidecar_service, CHAT, chat_body(url))
        assert_error(chat, 400, "invalid_request_error")
        error = chat.json()["error"]
        assert error["param"] == "messages.0.content.0.image_url.url", name
        assert error["message"].startswith(error["param"] + ": "), name
        body = {"input_text": "What is this?", "images": [data_url(png()), url]}
        on_predict = predict(sidecar_service.url, body)
        message = assert_error(on_predict, 400, reason)
        assert message.startswith("images.1: "), name
        got[name] = error["code"]
    assert got == {name: reason for name, (_, reason, _) in HOSTILE.items()}
    assert model_worker(sidecar_service).pid == worker.pid and worker.is_running()
    assert httpx.get(sidecar_service.url + "/readyz", timeout=10).json()["ready"] is True


def test_a_valid_image_to_a_text_model_is_a_400_that_names_the_model(
    sidecar_service: Service, tiny_model_dir: Path
) -> None:
    url = data_url(jpeg(), "image/jpeg")
    says = f"the model {tiny_model_dir.name!r} reads text only"
    chat = post(sidecar_service, CHAT, chat_body(url))
    assert says in assert_error(chat, 400, "invalid_request_error")
    assert chat.json()["error"]["code"] == "image_input_unsupported"
    streamed = post(sidecar_service, CHAT, chat_body(url, stream=True))
    assert streamed.status_code == 400  # refused before any stream starts
    assert streamed.json()["error"]["code"] == "image_input_unsupported"
    for body in (
        {"input_text": "What is this?", "images": [url]},
        {"system": "Be brief.", "input_text": "What is this?", "images": [url]},
        {"messages": [{"role": "user", "content": [image_part(url)]}]},
    ):
        assert says in assert_error(
            predict(sidecar_service.url, body), 400, "image_input_unsupported"
        )
    content = [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "What?"}]
    responses = post(
        sidecar_service, "/v1/responses", {"input": [{"role": "user", "content": content}]}
    )
    assert says in assert_error(responses, 400, "invalid_request_error")
    assert responses.json()["error"]["code"] == "image_input_unsupported"


def test_the_openai_sdk_sends_a_data_url_and_gets_a_bad_request_error(
    sidecar_service: Service, tiny_model_dir: Path
) -> None:
    url = data_url(png())
    content: Any = [
        {"type": "text", "text": "What is in this image?"},
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
    ]
    with OpenAI(base_url=sidecar_service.url + "/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": content}], max_tokens=5
            )
        assert raised.value.code == "image_input_unsupported"
        assert tiny_model_dir.name in raised.value.message
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(
                model="any",
                messages=[{"role": "user", "content": content}],
                max_tokens=5,
                stream=True,
            )
        assert raised.value.code == "image_input_unsupported"
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(
                model="any",
                input=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_image", "image_url": url, "detail": "auto"},
                            {"type": "input_text", "text": "What is this?"},
                        ],
                    }
                ],
            )
        assert raised.value.code == "image_input_unsupported"


def test_readyz_and_the_model_list_say_the_model_reads_text_only(
    sidecar_service: Service,
) -> None:
    ready = httpx.get(sidecar_service.url + "/readyz", timeout=10).json()
    assert ready["ready"] is True and ready["image_input"] is False
    (model,) = httpx.get(sidecar_service.url + "/v1/models", timeout=10).json()["data"]
    assert model["input_modalities"] == ["text"]
    one = httpx.get(f"{sidecar_service.url}/v1/models/{model['id']}", timeout=10).json()
    assert one["input_modalities"] == ["text"]


@pytest.mark.parametrize("role", ["system", "assistant", "developer"])
def test_images_come_in_user_messages_only(sidecar_service: Service, role: str) -> None:
    turn = {"role": role, "content": [image_part(data_url(png())), {"type": "text", "text": "x"}]}
    messages: list[dict[str, Any]] = [turn, {"role": "user", "content": "Hi"}]
    if role == "assistant":
        messages.insert(0, {"role": "user", "content": "Hi"})
    body = {"messages": messages, "max_tokens": 3}
    response = post(sidecar_service, CHAT, body)
    message = assert_error(response, 400, "invalid_request_error")
    assert "only a user message may hold image_url parts" in message
    if role != "developer":
        on_predict = predict(sidecar_service.url, {"messages": messages})
        assert "only a user message may hold image_url parts" in assert_error(on_predict, 422)


def test_predict_images_go_with_input_text_only(sidecar_service: Service) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "images": [data_url(png())]}
    message = assert_error(predict(sidecar_service.url, body), 422, "invalid_request")
    assert message.startswith("images: only with input_text")


def test_the_wrong_shape_of_an_image_part_names_its_field(sidecar_service: Service) -> None:
    for part, param in (
        ({"type": "image_url", "image_url": {"url": 3}}, "messages.0.content.0.image_url.url"),
        ({"type": "image_url", "image_url": "data:,"}, "messages.0.content.0.image_url"),
        (
            {"type": "image_url", "image_url": {"url": "data:,", "detail": "max"}},
            "messages.0.content.0.image_url.detail",
        ),
        ({"type": "text", "text": 1}, "messages.0.content.0.text"),
    ):
        body = {"messages": [{"role": "user", "content": [part]}]}
        response = post(sidecar_service, CHAT, body)
        assert_error(response, 400, "invalid_request_error")
        assert response.json()["error"]["param"] == param


def noise_png(side: int) -> bytes:
    """A PNG that does not compress: its file is about 3 x side x side bytes."""
    pixels = random.Random(side).randbytes(3 * side * side)
    return encoded(Image.frombytes("RGB", (side, side), pixels), "PNG")


def test_the_body_bound_lets_images_through_and_keeps_text_small(
    sidecar_service: Service,
) -> None:
    big = noise_png(600)  # about 1 MB: 1.4 MB of base64, over MAX_BODY_BYTES (64 KiB)
    assert len(big) > 900_000
    response = post(sidecar_service, CHAT, chat_body(data_url(big)))
    assert response.json()["error"]["code"] == "image_input_unsupported"
    on_predict = predict(sidecar_service.url, {"input_text": "Hi", "images": [data_url(big)]})
    assert_error(on_predict, 400, "image_input_unsupported")
    # The text beside the images still has MAX_BODY_BYTES:
    long_text = chat_body(data_url(png()), text="tell me more " * 6000)
    message = assert_error(post(sidecar_service, CHAT, long_text), 413, "invalid_request_error")
    assert "besides its images' data URLs" in message
    # and a text-only body that merely mentions a data URL is no image:
    mention = {"messages": [{"role": "user", "content": "data:image/png;base64," + "A" * 80_000}]}
    assert_error(post(sidecar_service, CHAT, mention), 413, "invalid_request_error")
    assert_error(predict(sidecar_service.url, {"input_text": "data: " + "x" * 80_000}), 413)
    # /v1/completions takes no images: its bound is MAX_BODY_BYTES
    prompt = {"prompt": "data:image/png;base64," + "A" * 80_000, "max_tokens": 2}
    assert_error(post(sidecar_service, "/v1/completions", prompt), 413, "invalid_request_error")


@pytest.fixture(scope="module")
def small_limits(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("logs") / "sidecar-image-limits.log"
    with services.sidecar(
        tiny_model_dir, log, MAX_IMAGES="2", MAX_IMAGE_BYTES="60000", MAX_IMAGE_PIXELS="40000"
    ) as service:
        yield service


def test_the_image_limits_are_the_settings(small_limits: Service) -> None:
    url = data_url(png())
    three = post(small_limits, CHAT, chat_body(url, url, url))
    assert "at most 2 are accepted (MAX_IMAGES)" in assert_error(three, 400)
    assert three.json()["error"]["code"] == "too_many_images"
    earlier = {"role": "user", "content": [image_part(url), {"type": "text", "text": "And?"}]}
    history = chat_body(url, url)
    history["messages"][:0] = [earlier, {"role": "assistant", "content": "A red square."}]
    assert post(small_limits, CHAT, history).json()["error"]["code"] == "too_many_images"
    large = post(small_limits, CHAT, chat_body(data_url(noise_png(150))))  # 67 KB
    assert "larger than 60000 bytes (MAX_IMAGE_BYTES)" in assert_error(large, 400)
    assert large.json()["error"]["code"] == "image_too_large"
    wide = post(small_limits, CHAT, chat_body(data_url(png(201, 200))))
    assert "(MAX_IMAGE_PIXELS)" in assert_error(wide, 400)
    assert wide.json()["error"]["code"] == "image_too_large"
    # Past the whole bound (MAX_BODY_BYTES + 2 data URLs of 60000 bytes): 413 before parsing.
    whole = 64 * 1024 + 2 * url_chars(60000)
    huge = {"messages": [{"role": "user", "content": "x"}], "pad": "A" * whole}
    message = assert_error(post(small_limits, CHAT, huge), 413, "invalid_request_error")
    assert f"or than {whole} bytes in all" in message
    assert post(small_limits, CHAT, chat_body(url, url)).json()["error"]["code"] == (
        "image_input_unsupported"
    )


def test_usage_headers_and_events_count_image_tokens(sidecar_service: Service) -> None:
    """A text model's replies say 0: the fields are there for every reply (a vision model's
    counts: the vision tests)."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    usage = post(sidecar_service, CHAT, body).json()["usage"]
    assert usage["prompt_tokens_details"]["image_tokens"] == 0
    plain = predict(sidecar_service.url, {"input_text": "Hi", "max_new_tokens": 3})
    assert plain.headers["x-image-tokens"] == "0"
    events = httpx.post(
        sidecar_service.url + "/predict",
        json={"input_text": "Hi", "max_new_tokens": 3},
        headers={"accept": "application/x-ndjson"},
        timeout=60,
    )
    done = json.loads(events.text.splitlines()[-1])
    assert done["done"] is True and done["image_tokens"] == 0
    response = post(sidecar_service, "/v1/responses", {"input": "Hi", "max_output_tokens": 3})
    assert response.json()["usage"]["input_tokens_details"]["image_tokens"] == 0


def test_the_log_line_and_metrics_count_images_never_their_bytes(
    sidecar_service: Service,
) -> None:
    before = metrics(sidecar_service.url)
    image = png(33, 22, (1, 2, 3))
    url = data_url(image)
    request_id = "images-" + uuid.uuid4().hex[:8]
    response = post(sidecar_service, CHAT, chat_body(url, url), **{"x-request-id": request_id})
    assert response.status_code == 400
    line = request_line(sidecar_service, request_id)
    assert line["images"] == 2 and "image_tokens" not in line  # it never reached the model
    assert line["error_type"] == "image_input_unsupported"
    refused_id = "images-" + uuid.uuid4().hex[:8]
    http_url = {"x-request-id": refused_id}
    post(sidecar_service, CHAT, chat_body("https://example.com/a.png"), **http_url)
    assert request_line(sidecar_service, refused_id)["error_type"] == "unsupported_image_url"
    after = metrics(sidecar_service.url)

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert grew('sidecar_image_refusals_total{reason="image_input_unsupported"}') == 1
    assert grew('sidecar_image_refusals_total{reason="unsupported_image_url"}') == 1
    assert grew('sidecar_image_refusals_total{reason="invalid_image"}') >= 0
    assert "sidecar_images_total" in after and "sidecar_image_tokens_total" in after
    log = sidecar_service.log()
    assert url.split(",")[1][:40] not in log and "example.com" not in log


def test_a_data_url_in_text_stays_text(sidecar_service: Service) -> None:
    """Text that looks like an image (a data URL, a typed tag) is text: the request is a
    text request, answered by the text model."""
    text = "Describe <|image_1|> and " + data_url(png(2, 2))
    response = post(sidecar_service, CHAT, {"messages": [{"role": "user", "content": text}]})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens_details"]["image_tokens"] == 0

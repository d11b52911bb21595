"""Images end to end on the tiny VISION model (`tiny-vision`, a phi3v folder read by the real
onnxruntime-genai): replies differ per image and repeat for the same one, on every route and
through the official `openai` SDK (streamed and not); usage, headers, the log line and /metrics
count the image tokens (the formula is sidecar.model.vision's, checked against the processor in
tests/models); a JSON schema holds a reply about an image; two images; typed image tags stay
text; a hostile image never reaches the worker; a request cancelled while its prompt is read.

They need the worker side of issue 36 (sidecar/model/: the vision model's Generator path, the
branch vision-engine): without it the model is served as text only and these fail with the
capability's 400."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from scripts.run import services
from scripts.run.services import Service
from sidecar.model.vision import image_tokens
from tests.sidecar.support import metrics, predict, request_line
from tests.sidecar.web.generation.test_sidecar_faults import model_worker
from tests.sidecar.web.images.image_files import chat_body, data_url, image_part, photo
from tests.sidecar.web.images.test_sidecar_images import HOSTILE
from tests.support.engines import paced

CHAT = "/v1/chat/completions"
RED, BLUE, GREEN = (200, 30, 30), (30, 30, 200), (30, 200, 30)
SIZE, OTHER_SIZE = (467, 311), (487, 206)  # 1,921 and 2,353 image tokens


def picture(color: tuple[int, int, int], size: tuple[int, int] = SIZE) -> str:
    return data_url(photo(*size, color))


def chat(service: Service, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(service.url + CHAT, json=body, headers=headers, timeout=120)


def answer(service: Service, *urls: str, text: str = "What is in this picture?") -> str:
    response = chat(service, chat_body(*urls, text=text, max_tokens=12))
    assert response.status_code == 200, response.text
    content: str = response.json()["choices"][0]["message"]["content"]
    return content


def test_readyz_and_the_model_list_say_the_model_reads_images(
    vision_sidecar_service: Service,
) -> None:
    ready = httpx.get(vision_sidecar_service.url + "/readyz", timeout=10).json()
    assert ready["ready"] is True and ready["image_input"] is True
    (model,) = httpx.get(vision_sidecar_service.url + "/v1/models", timeout=10).json()["data"]
    assert model["input_modalities"] == ["text", "image"]


def test_replies_differ_per_image_and_repeat_for_the_same_image(
    vision_sidecar_service: Service,
) -> None:
    red, blue, green = picture(RED), picture(BLUE), picture(GREEN)
    replies = [answer(vision_sidecar_service, url) for url in (red, blue, green)]
    assert len(set(replies)) == 3, replies
    assert (
        answer(vision_sidecar_service, red) == replies[0]
    )  # greedy: the same image, the same reply
    # /predict's images stand before its text, as the parts above: the same prompt
    body = {"input_text": "What is in this picture?", "images": [red], "max_new_tokens": 12}
    assert predict(vision_sidecar_service.url, body).text == replies[0]
    # the same pixels as a JPEG or WEBP are another file, but still an image the model reads
    assert answer(vision_sidecar_service, data_url(photo(*SIZE, BLUE), "image/png")) == replies[1]


def test_usage_headers_log_and_metrics_count_the_image_tokens(
    vision_sidecar_service: Service,
) -> None:
    expected = image_tokens(*SIZE)
    assert expected == 1921
    before = metrics(vision_sidecar_service.url)
    request_id = "vision-" + uuid.uuid4().hex[:8]
    response = chat(vision_sidecar_service, chat_body(picture(RED)), **{"x-request-id": request_id})
    usage = response.json()["usage"]
    assert usage["prompt_tokens_details"]["image_tokens"] == expected
    assert usage["prompt_tokens"] > expected  # the text's tokens too
    line = request_line(vision_sidecar_service, request_id)
    assert (line["images"], line["image_tokens"]) == (1, expected)
    assert line["prompt_tokens"] == usage["prompt_tokens"]
    after = metrics(vision_sidecar_service.url)
    assert after["sidecar_images_total"] - before["sidecar_images_total"] == 1
    grown = after["sidecar_image_tokens_total"] - before["sidecar_image_tokens_total"]
    assert grown == expected
    body = {"input_text": "What?", "images": [picture(RED)], "max_new_tokens": 4}
    plain = predict(vision_sidecar_service.url, body)
    assert plain.status_code == 200 and plain.headers["x-image-tokens"] == str(expected)
    events = httpx.post(
        vision_sidecar_service.url + "/predict",
        json=body,
        headers={"accept": "application/x-ndjson"},
        timeout=120,
    )
    done = json.loads(events.text.splitlines()[-1])
    assert done["image_tokens"] == expected and done["prompt_tokens"] > expected
    assert picture(RED).split(",")[1][:40] not in vision_sidecar_service.log()


def test_the_openai_sdk_streamed_and_not(vision_sidecar_service: Service) -> None:
    content: Any = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": picture(GREEN), "detail": "high"}},
    ]
    messages: Any = [{"role": "user", "content": content}]
    with OpenAI(
        base_url=vision_sidecar_service.url + "/v1", api_key="unused", max_retries=0
    ) as client:
        whole = client.chat.completions.create(model="any", messages=messages, max_tokens=12)
        stream = client.chat.completions.create(
            model="any",
            messages=messages,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and text == whole.choices[0].message.content
    usage = chunks[-1].usage
    assert usage is not None and whole.usage is not None
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    details = whole.usage.prompt_tokens_details
    assert details is not None and details.model_dump()["image_tokens"] == image_tokens(*SIZE)


def test_the_responses_api_reads_an_input_image(vision_sidecar_service: Service) -> None:
    with OpenAI(
        base_url=vision_sidecar_service.url + "/v1", api_key="unused", max_retries=0
    ) as client:
        response = client.responses.create(
            model="any",
            max_output_tokens=12,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": picture(RED), "detail": "auto"},
                        {"type": "input_text", "text": "What is in this picture?"},
                    ],
                }
            ],
        )
        follow = client.responses.create(
            model="any", max_output_tokens=4, previous_response_id=response.id, input="And?"
        )
    assert response.output_text == answer(vision_sidecar_service, picture(RED))
    assert response.usage is not None and follow.usage is not None
    details = response.usage.input_tokens_details.model_dump()
    assert details["image_tokens"] == image_tokens(*SIZE)
    # the stored conversation holds the image: the next turn reads it again
    assert follow.usage.input_tokens_details.model_dump()["image_tokens"] == image_tokens(*SIZE)


def test_a_json_schema_holds_a_reply_about_an_image(vision_sidecar_service: Service) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "maxLength": 20}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    body = chat_body(picture(BLUE), response_format=response_format)
    body["max_tokens"] = 60
    response = chat(vision_sidecar_service, body)
    assert response.status_code == 200, response.text
    reply = json.loads(response.json()["choices"][0]["message"]["content"])
    assert set(reply) == {"colour"} and isinstance(reply["colour"], str)
    assert response.json()["usage"]["prompt_tokens_details"]["image_tokens"] == 1921


def test_two_images_in_one_prompt(vision_sidecar_service: Service) -> None:
    red, blue = picture(RED), picture(BLUE, OTHER_SIZE)
    response = chat(vision_sidecar_service, chat_body(red, blue, max_tokens=12))
    usage = response.json()["usage"]
    assert usage["prompt_tokens_details"]["image_tokens"] == 1921 + 2353
    swapped = answer(vision_sidecar_service, blue, red)
    assert response.json()["choices"][0]["message"]["content"] != swapped  # order is kept
    # an image in an earlier turn is read again with each turn (and counted in MAX_IMAGES)
    earlier = {"role": "user", "content": [image_part(red), {"type": "text", "text": "This?"}]}
    history = chat_body(blue)
    history["messages"][:0] = [earlier, {"role": "assistant", "content": "A red picture."}]
    turn = chat(vision_sidecar_service, history).json()
    assert turn["usage"]["prompt_tokens_details"]["image_tokens"] == 1921 + 2353


def test_typed_image_tags_stay_text(vision_sidecar_service: Service) -> None:
    """Three typed tags and one image: 1,921 image tokens, not three images' worth (5,763
    with the tags read as tags); with no image, the tags are text to the model."""
    typed = "<|image_1|><|image_1|><|image_1|> what is <|image_2|> this?"
    with_image = chat(vision_sidecar_service, chat_body(picture(RED), text=typed)).json()
    assert with_image["usage"]["prompt_tokens_details"]["image_tokens"] == 1921
    body = {"messages": [{"role": "user", "content": typed}], "max_tokens": 4}
    text_only = chat(vision_sidecar_service, body).json()
    assert text_only["usage"]["prompt_tokens_details"]["image_tokens"] == 0
    assert text_only["usage"]["prompt_tokens"] < 200
    # the typed tags are read as the text they are: their characters' tokens beside the image's
    plain = chat(vision_sidecar_service, chat_body(picture(RED), text=" what is  this?")).json()
    typed_tokens = with_image["usage"]["prompt_tokens"] - plain["usage"]["prompt_tokens"]
    assert (
        typed_tokens
        == text_only["usage"]["prompt_tokens"]
        - chat(
            vision_sidecar_service, {"messages": [{"role": "user", "content": " what is  this?"}]}
        ).json()["usage"]["prompt_tokens"]
    )
    assert typed_tokens > 4


def test_hostile_images_never_reach_the_vision_worker(vision_sidecar_service: Service) -> None:
    worker = model_worker(vision_sidecar_service)
    for name, (make, reason, _) in HOSTILE.items():
        response = chat(vision_sidecar_service, chat_body(make()))
        assert response.status_code == 400, name
        assert response.json()["error"]["code"] == reason, name
    assert model_worker(vision_sidecar_service).pid == worker.pid
    assert answer(vision_sidecar_service, picture(GREEN))


@pytest.fixture(scope="module")
def slow_vision_service(
    tiny_vision_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """The vision model read slowly: a second before each prompt chunk (16 tokens). A stream
    starts when its reply does (no early start), so its headers say the worker started it."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-vision-slow.log"
    with services.sidecar(
        tiny_vision_model_dir,
        log,
        PREFILL_CHUNK="16",
        STREAM_START_AFTER_S="10",
        env=paced(pace=0.05, prefill_pace=1.0),
    ) as service:
        yield service


def test_a_request_cancelled_while_its_image_prompt_is_read(
    slow_vision_service: Service,
) -> None:
    worker = model_worker(slow_vision_service)
    request_id = "cancel-" + uuid.uuid4().hex[:8]
    body = chat_body(picture(RED), text="Describe it. " * 40, stream=True, max_tokens=50)
    with httpx.stream(
        "POST",
        slow_vision_service.url + CHAT,
        json=body,
        headers={"x-request-id": request_id},
        timeout=120,
    ) as response:
        # The worker started the reply (its headers count the prompt); its prompt, an image
        # and then 10 chunks of text at a second each, is being read: leave now.
        assert response.status_code == 200
        assert response.headers["x-image-tokens"] == str(image_tokens(*SIZE))
    line = request_line(slow_vision_service, request_id, timeout=120)
    assert line["outcome"] == "cancelled" and line["images"] == 1
    assert line["image_tokens"] == image_tokens(*SIZE) < line["prompt_tokens"]
    assert (line.get("generated_tokens") or 0) == 0  # it never got past the prompt
    assert model_worker(slow_vision_service).pid == worker.pid
    again = httpx.post(
        slow_vision_service.url + CHAT, json=chat_body(picture(BLUE), max_tokens=2), timeout=120
    )
    assert again.status_code == 200 and again.json()["usage"]["prompt_tokens_details"][
        "image_tokens"
    ] == image_tokens(*SIZE)


def test_a_text_request_to_the_vision_model_has_no_image_tokens(
    vision_sidecar_service: Service,
) -> None:
    response = chat(vision_sidecar_service, {"messages": [{"role": "user", "content": "Hi"}]})
    assert response.status_code == 200
    assert response.json()["usage"]["prompt_tokens_details"]["image_tokens"] == 0


def test_the_sdk_raises_bad_request_for_a_remote_url(vision_sidecar_service: Service) -> None:
    content: Any = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    client = OpenAI(base_url=vision_sidecar_service.url + "/v1", api_key="unused", max_retries=0)
    with client, pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": content}], max_tokens=3
        )
    assert raised.value.code == "unsupported_image_url"
    assert "the sidecar fetches nothing" in raised.value.message


@pytest.mark.parametrize("image_allowance", [10.0, 0.0])
def test_reading_an_image_longer_than_worker_stall_s_is_work_not_a_stall(
    tiny_vision_model_dir: Path, tmp_path: Path, image_allowance: float
) -> None:
    """The step that reads a prompt's images answers no ping (onnxruntime-genai holds the
    GIL): WORKER_STALL_IMAGE_S an image keeps the watchdog from killing a worker that is busy
    with one. Without it (0), the same 6-second step is taken for a frozen worker."""
    settings = {
        "WORKER_STALL_S": "1",
        "WORKER_STALL_IMAGE_S": str(image_allowance),
        **paced(0.0, image_step=6.0),
    }
    log = tmp_path / "sidecar.log"
    with services.sidecar(tiny_vision_model_dir, log, env=settings) as service:
        worker = model_worker(service)
        response = httpx.post(
            service.url + CHAT, json=chat_body(picture(RED), max_tokens=2), timeout=60
        )
        if image_allowance:
            assert response.status_code == 200, response.text
            assert "model worker stalled" not in service.log()
            assert model_worker(service).pid == worker.pid
        else:
            assert response.status_code >= 500
            assert "model worker stalled" in service.log()

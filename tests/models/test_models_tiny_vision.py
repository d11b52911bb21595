"""The generated `tiny-vision` model (a phi3v folder) through the real onnxruntime-genai 0.18.0
and its image processor, as the sidecar's worker uses them."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from PIL import Image

from sidecar.model.engine import og  # the sidecar's import: telemetry off first
from sidecar.model.folder import is_complete
from sidecar.model.vision import MAX_SIDE, hd_size, image_tokens

from scripts.models import make_model
from scripts.models.modelgen import vision

PROMPT = "<|user|>\n{tags}What is in the picture?<|end|>\n<|assistant|>\n"


def png(width: int, height: int, colour: tuple[int, int, int], seed: int = 0) -> bytes:
    """A PNG of noise around one colour: deterministic, and unlike any other colour's."""
    rng = np.random.default_rng(seed)
    pixels = np.clip(rng.normal(colour, 40, size=(height, width, 3)), 0, 255)
    out = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(out, "PNG")
    return out.getvalue()


RED, BLUE, GREEN, GREY = (200, 30, 30), (30, 30, 200), (30, 200, 30), (128, 128, 128)


@pytest.fixture(scope="module")
def model(tiny_vision_model_dir: Path) -> Any:
    return og.Model(str(tiny_vision_model_dir))


@pytest.fixture(scope="module")
def processor(model: Any) -> Any:
    return model.create_multimodal_processor()


def process(processor: Any, prompt: str, images: Sequence[bytes]) -> Any:
    return processor(prompt, images=og.Images.open_bytes(*images) if images else None)


def reply(model: Any, processor: Any, images: Sequence[bytes], new: int = 12) -> list[int]:
    tags = "".join(f"<|image_{k}|>\n" for k in range(1, len(images) + 1))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16384)
    generator = og.Generator(model, params)
    generator.set_inputs(process(processor, PROMPT.format(tags=tags), images))
    tokens: list[int] = []
    while not generator.is_done() and len(tokens) < new:
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens


def test_folder_has_the_published_phi3v_layout(tiny_vision_model_dir: Path) -> None:
    names = {p.name for p in tiny_vision_model_dir.iterdir()}
    assert names == {
        "genai_config.json",
        "processor_config.json",
        vision.DECODER,
        f"{vision.DECODER}.data",  # the embedding graph reads its table from here too
        vision.EMBEDDING,
        vision.VISION,
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
    }
    config = json.loads((tiny_vision_model_dir / "genai_config.json").read_text())["model"]
    assert config["type"] == "phi3v"
    assert set(config["decoder"]["inputs"]) == {
        "inputs_embeds",
        "attention_mask",
        "past_key_names",
        "past_value_names",
    }
    assert config["embedding"]["filename"] == vision.EMBEDDING
    assert config["vision"]["config_filename"] == "processor_config.json"
    transforms = json.loads((tiny_vision_model_dir / "processor_config.json").read_text())
    kinds = [t["operation"]["type"] for t in transforms["processor"]["transforms"]]
    assert kinds == ["DecodeImage", "ConvertRGB", "Phi3ImageTransform"]
    for name in (vision.DECODER, vision.EMBEDDING, vision.VISION):
        graph = onnx.load(str(tiny_vision_model_dir / name), load_external_data=False)
        assert graph.ir_version <= 10, name  # onnxruntime 1.31 refuses IR 14
    decoder = onnx.load(str(tiny_vision_model_dir / vision.DECODER), load_external_data=False)
    assert [i.name for i in decoder.graph.input][:2] == ["inputs_embeds", "attention_mask"]
    ops = {n.op_type for n in decoder.graph.node}
    assert {"GroupQueryAttention", "MatMulNBits"} <= ops and "Gather" in ops  # mask's Gather
    assert "/model/embed_tokens/Gather" not in {n.name for n in decoder.graph.node}


def test_same_arguments_give_byte_identical_files(
    tiny_vision_model_dir: Path, tmp_path: Path
) -> None:
    assert make_model.main(["--preset", "tiny-vision", "--out", str(tmp_path / "again")]) == 0
    again = {p.name: p.read_bytes() for p in (tmp_path / "again").iterdir()}
    assert again == {p.name: p.read_bytes() for p in tiny_vision_model_dir.iterdir()}


def test_variant_options_are_refused_for_the_vision_preset(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        make_model.parse_args(["--preset", "tiny-vision", "--out", str(tmp_path), "--graph-only"])


def test_the_same_image_repeats_its_reply_and_other_images_change_it(
    model: Any, processor: Any
) -> None:
    images = [
        png(467, 311, RED),
        png(467, 311, BLUE),
        png(467, 311, GREEN),
        png(300, 300, GREY, seed=1),
        png(20, 3000, GREY, seed=2),
    ]
    replies = [reply(model, processor, [image]) for image in images]
    assert reply(model, processor, [images[0]]) == replies[0]  # greedy, deterministic
    assert len({tuple(r) for r in replies}) == len(replies), replies


def test_two_images_in_one_prompt(model: Any, processor: Any) -> None:
    red, blue = png(467, 311, RED), png(487, 206, BLUE)
    inputs = process(processor, PROMPT.format(tags="<|image_1|>\n<|image_2|>\n"), [red, blue])
    ids = inputs["input_ids"].as_numpy().ravel()
    counts = [int(n) for n in inputs["num_image_tokens"].as_numpy().ravel()]
    assert counts == [image_tokens(467, 311), image_tokens(487, 206)] == [1921, 2353]
    assert [int((ids == -k).sum()) for k in (1, 2)] == counts
    assert inputs["pixel_values"].as_numpy().shape == (2, 17, 3, 336, 336)
    both = reply(model, processor, [red, blue])
    assert len(both) == 12
    assert both != reply(model, processor, [blue, red])  # order matters: features in order


@pytest.mark.parametrize(
    "size",
    [
        (1, 1),
        (467, 311),
        (311, 467),
        (487, 206),
        (20, 3000),
        (3000, 20),
        (336, 336),
        (640, 480),
        (1920, 1080),
        (1080, 1920),
        (5376, 1),  # the narrowest image the processor takes
    ],
)
def test_image_token_formula_matches_the_processor(processor: Any, size: tuple[int, int]) -> None:
    """sidecar.model.vision.image_tokens against onnxruntime-genai's own count: a version of
    onnxruntime-genai or onnxruntime-extensions that counts otherwise fails here (docs/models.md
    quotes the formula)."""
    width, height = size
    inputs = process(processor, "<|image_1|>", [png(width, height, GREY)])
    assert tuple(int(v) for v in inputs["image_sizes"].as_numpy().ravel()) == hd_size(
        width, height
    )
    assert int(inputs["num_image_tokens"].as_numpy().ravel()[0]) == image_tokens(width, height)
    assert int(inputs["input_ids"].as_numpy().size) == image_tokens(width, height)


def test_measured_token_counts() -> None:
    """The figures docs/models.md gives: 16 crops whatever the image."""
    assert image_tokens(1, 1) == image_tokens(4000, 4000) == 2509
    assert image_tokens(467, 311) == 1921
    assert image_tokens(487, 206) == 2353
    assert image_tokens(20, 3000) == 2653


@pytest.mark.parametrize("size", [(5377, 1), (1, 5377), (MAX_SIDE + 1, 4)])
def test_images_the_processor_refuses_raise(processor: Any, size: tuple[int, int]) -> None:
    """Too narrow (the short side scales to no pixel) or a side over MAX_SIDE: a RuntimeError
    the worker turns into invalid_image, not a crash."""
    with pytest.raises(RuntimeError):
        process(processor, "<|image_1|>", [png(*size, GREY)])
    if max(size) <= MAX_SIDE:
        with pytest.raises(ValueError):
            hd_size(*size)


def test_image_tags_are_plain_text_to_the_tokenizer(model: Any) -> None:
    """The processor splits the prompt on <|image_N|> before the tokenizer sees it, so the
    tokenizer needs no tag token: typed tags only ever become image slots through the
    processor, which the sidecar never hands user text."""
    tokenizer = og.Tokenizer(model)
    ids = [int(i) for i in tokenizer.encode("<|image_1|>")]
    assert len(ids) > 1 and tokenizer.decode(ids) == "<|image_1|>"
    specials = make_model.special_ids(vision.VISION_PRESETS["tiny-vision"].vocab).values()
    assert not set(ids) & set(specials)


def test_a_vision_folder_is_complete_with_all_its_graphs(
    tiny_vision_model_dir: Path, tmp_path: Path
) -> None:
    """What the download and run_local check before they trust a folder: a phi3v folder
    without its vision graph or processor configuration is not complete."""
    assert is_complete(tiny_vision_model_dir)
    for missing in (vision.VISION, vision.EMBEDDING, "processor_config.json"):
        folder = tmp_path / missing
        shutil.copytree(tiny_vision_model_dir, folder)
        (folder / missing).unlink()
        assert not is_complete(folder), missing

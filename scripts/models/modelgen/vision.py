"""A tiny `phi3v` folder (Phi-3.5-vision's layout) that onnxruntime-genai loads and answers
images with, offline: `make_model.py --preset tiny-vision`.

Three graphs, named as in the published Phi-3.5-vision ONNX folder:
- the text decoder: the tiny preset's decoder (the same weights, GroupQueryAttention and
  MatMulNBits int4) taking `inputs_embeds` instead of `input_ids`, which the official builder
  makes with `--extra_options exclude_embeds=true`;
- the embedding: a Gather of the token ids from the decoder's own embedding table (the same
  bytes in the decoder's data file), with the image features scattered, in order, over the
  prompt's negative ids (the processor writes image k's slots as `-k`);
- the vision graph: not a vision transformer but a cheap deterministic function of the pixels
  (each crop pooled to 4x4 means per channel, then a random projection), so different images
  give different features and the same image the same ones. It makes exactly as many feature
  rows as the processor counts image tokens, from `image_sizes` (the formula that
  sidecar/model/vision.py holds and tests/models checks against the processor).
Plus genai_config.json (type phi3v) and processor_config.json as the published folder has them,
and the tiny tokenizer as it is: the processor splits the prompt on `<|image_N|>` before the
tokenizer sees it (each piece of text is encoded alone), so no tag needs a token.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from scripts.models.modelgen.config import Shape, dump_json, genai_config
from scripts.models.modelgen.graph import build_graph
from scripts.models.modelgen.tokenizer import write_tokenizer
from scripts.models.modelgen.vocab import PHI3_VOCAB
from scripts.models.modelgen.weights import DataFile

# The tiny preset's decoder and tokenizer; a longer context: an image is 1,321 to 2,653 tokens.
# phi3-mini-vision: Phi-3.5-vision's text decoder (Phi-3-mini's shapes, its 394 MB fp32
# embedding table) with the cheap vision graph below, for what an image costs the decoder
# (`python -m scripts.bench images`).
VISION_PRESETS = {
    "tiny-vision": Shape(64, 2, 4, 4, 128, 1024, 16384),
    "phi3-mini-vision": Shape(3072, 32, 32, 32, 8192, PHI3_VOCAB, 8192),
}

# The published Phi-3.5-vision-instruct ONNX folder's file names
DECODER = "phi-3.5-v-instruct-text.onnx"
EMBEDDING = "phi-3.5-v-instruct-text-embedding.onnx"
VISION = "phi-3.5-v-instruct-vision.onnx"
PROCESSOR_CONFIG = "processor_config.json"

CROPS = 17  # the HD transform's crops per image: a global view and up to 16 tiles
SIDE = 336  # pixels per crop side
IMAGE_TOKENS_PER_CROP = 144  # Phi-3-vision's num_img_tokens
NEWLINE_TOKENS = 12  # separator tokens per row of tiles and for the global view
POOL = 4  # each crop is pooled to POOL x POOL means per channel
# Magnitude of the image features: that of the embedding rows (standard normal). Images then
# decide the tiny decoder's greedy replies (different colours, different replies).
FEATURE_RMS = 1.0
# The embedding table's tensor name in the tiny decoder (scripts/models/modelgen/graph.py)
EMBED_TABLE = "model.embed_tokens.weight"
EMBED_GATHER = "/model/embed_tokens/Gather"


def vision_genai_config(shape: Shape) -> dict[str, Any]:
    """The phi3v genai_config.json: the tiny decoder's section reading inputs_embeds, and the
    embedding and vision sections of the published folder."""
    config = genai_config(shape)
    model = config["model"]
    decoder = model["decoder"]
    decoder["filename"] = DECODER
    inputs = decoder["inputs"]
    del inputs["input_ids"]
    decoder["inputs"] = {"inputs_embeds": "inputs_embeds", **inputs}
    model["embedding"] = {
        "filename": EMBEDDING,
        "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
        "outputs": {"inputs_embeds": "inputs_embeds"},
    }
    model["vision"] = {
        "filename": VISION,
        "config_filename": PROCESSOR_CONFIG,
        "inputs": {"pixel_values": "pixel_values", "image_sizes": "image_sizes"},
        "outputs": {"image_features": "image_features"},
    }
    model["type"] = "phi3v"
    return config


def processor_config() -> dict[str, Any]:
    """The published folder's processor_config.json (onnxruntime-extensions' image pipeline).
    `num_crops` is ignored by onnxruntime-extensions 0.18's Phi3ImageTransform, which always
    makes up to 16 tiles; the published value is kept."""
    return {
        "processor": {
            "name": "phi_3_image_processor",
            "transforms": [
                {
                    "operation": {
                        "name": "decode_image",
                        "domain": "com.microsoft.extensions",
                        "type": "DecodeImage",
                        "attrs": {"color_space": "BGR"},
                    }
                },
                {
                    "operation": {
                        "name": "convert_to_rgb",
                        "domain": "com.microsoft.extensions",
                        "type": "ConvertRGB",
                    }
                },
                {
                    "operation": {
                        "name": "phi3_image_transform",
                        "domain": "com.microsoft.extensions",
                        "type": "Phi3ImageTransform",
                        "attrs": {"num_crops": 4, "num_img_tokens": IMAGE_TOKENS_PER_CROP},
                    }
                },
            ],
        }
    }


def make_vision_model(shape: Shape, out: Path, seed: int = 0) -> int:
    """Write the phi3v folder; returns the size of the decoder's data file."""
    out.mkdir(parents=True, exist_ok=True)
    tokens = write_tokenizer(out, shape.vocab)
    dump_json(out / "genai_config.json", vision_genai_config(shape))
    dump_json(out / PROCESSOR_CONFIG, processor_config())
    data_path = out / f"{DECODER}.data"
    partial = data_path.with_name(data_path.name + ".partial")
    data = DataFile(partial, data_path.name, seed)
    try:
        decoder = build_graph(shape, data, tokens)
    finally:
        data.close()
    decoder, table = embeds_input(decoder, shape)
    onnx.save_model(decoder, out / DECODER)
    onnx.save_model(embedding_graph(shape, table), out / EMBEDDING)
    rng = np.random.default_rng([seed, 36])  # the projection's own stream
    onnx.save_model(vision_graph(shape, rng), out / VISION)
    partial.replace(data_path)
    return data.offset


def embeds_input(decoder: onnx.ModelProto, shape: Shape) -> tuple[onnx.ModelProto, TensorProto]:
    """The decoder without its embedding: `inputs_embeds` [batch, sequence, hidden] feeds what
    the Gather fed. Returns it and the embedding table (its external data stays where the
    decoder's data file holds it; the embedding graph reads it there)."""
    graph = decoder.graph
    gather = next(n for n in graph.node if n.name == EMBED_GATHER)
    embedded = gather.output[0]
    graph.node.remove(gather)
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == embedded:
                node.input[i] = "inputs_embeds"
    table = next(t for t in graph.initializer if t.name == EMBED_TABLE)
    graph.initializer.remove(table)
    ids = next(i for i in graph.input if i.name == "input_ids")
    at = list(graph.input).index(ids)
    graph.input.remove(ids)
    embeds = helper.make_tensor_value_info(
        "inputs_embeds", TensorProto.FLOAT, ["batch_size", "sequence_length", shape.hidden]
    )
    graph.input.insert(at, embeds)
    return decoder, copy.deepcopy(table)


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", 21)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="phi3-chat make_model")
    model.ir_version = 10  # onnxruntime 1.31 refuses onnx 1.23's default (IR 14)
    return model


def embedding_graph(shape: Shape, table: TensorProto) -> onnx.ModelProto:
    """input_ids [batch, sequence] (int64; negative: image slots), image_features [rows,
    hidden] -> inputs_embeds [batch, sequence, hidden]: the table's row for each id >= 0, and
    the next image feature row, in order, for each id < 0."""
    i64, f32 = TensorProto.INT64, TensorProto.FLOAT
    nodes = [
        # Text: Gather with negative ids clamped to 0 (their rows are replaced below)
        helper.make_node("Max", ["input_ids", "zero"], ["ids"]),
        helper.make_node("Gather", [EMBED_TABLE, "ids"], ["text"]),
        # Image slots: a running count of negative ids says which feature row each one takes
        helper.make_node("Less", ["input_ids", "zero"], ["is_image"]),
        helper.make_node("Cast", ["is_image"], ["image_flags"], to=i64),
        helper.make_node("CumSum", ["image_flags", "one"], ["running"]),
        helper.make_node("Sub", ["running", "one"], ["feature_row"]),
        helper.make_node("Max", ["feature_row", "zero"], ["feature_index"]),
        # No image: one zero row, so the Gather below has a row to read
        helper.make_node("Concat", ["image_features", "zero_row"], ["features"], axis=0),
        helper.make_node("Gather", ["features", "feature_index"], ["image"]),
        helper.make_node("Unsqueeze", ["is_image", "minus_one"], ["mask"]),
        helper.make_node("Where", ["mask", "image", "text"], ["inputs_embeds"]),
    ]
    initializers = [
        table,
        helper.make_tensor("zero", i64, [], [0]),
        helper.make_tensor("one", i64, [], [1]),
        helper.make_tensor("minus_one", i64, [1], [-1]),
        helper.make_tensor("zero_row", f32, [1, shape.hidden], [0.0] * shape.hidden),
    ]
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("image_features", f32, ["num_image_tokens", shape.hidden]),
    ]
    outputs = [
        helper.make_tensor_value_info(
            "inputs_embeds", f32, ["batch_size", "sequence_length", shape.hidden]
        )
    ]
    return _model(helper.make_graph(nodes, "embedding", inputs, outputs, initializers))


def vision_graph(shape: Shape, rng: np.random.Generator) -> onnx.ModelProto:
    """pixel_values [images, 17, 3, 336, 336], image_sizes [images, 2] -> image_features
    [image tokens, hidden]: image i's rows are its crops' features in turn (row r of the image
    takes crop r mod 17), as many rows as `vision.image_tokens` counts for its size."""
    i64, f32 = TensorProto.INT64, TensorProto.FLOAT
    cell = SIDE // POOL
    features = 3 * POOL * POOL
    projection = rng.standard_normal((features, shape.hidden)).astype(np.float32)
    # Pixel values are normalized (CLIP's mean and std: RMS about 1); each feature sums
    # `features` of them, so dividing by its root keeps RMS about 1 before the scale.
    projection *= FEATURE_RMS / np.sqrt(features)
    tokens = IMAGE_TOKENS_PER_CROP
    nodes = [
        # One descriptor per crop: [images * 17, 3 * POOL * POOL]
        helper.make_node("Reshape", ["pixel_values", "cells_shape"], ["cells"]),
        helper.make_node("ReduceMean", ["cells", "cell_axes"], ["pooled"], keepdims=0),
        helper.make_node("Reshape", ["pooled", "descriptor_shape"], ["descriptors"]),
        helper.make_node("MatMul", ["descriptors", "projection"], ["crop_features"]),
        # Tokens per image from its size: (h/336 * w/336 + 1) * 144 + 1 + (h/336 + 1) * 12
        helper.make_node("Div", ["image_sizes", "side"], ["tiles"]),
        helper.make_node("Split", ["tiles"], ["tiles_h", "tiles_w"], axis=1, num_outputs=2),
        helper.make_node("Mul", ["tiles_h", "tiles_w"], ["grid"]),
        helper.make_node("Add", ["grid", "one"], ["crops_used"]),
        helper.make_node("Mul", ["crops_used", "tokens_per_crop"], ["crop_tokens"]),
        helper.make_node("Add", ["tiles_h", "one"], ["rows_h"]),
        helper.make_node("Mul", ["rows_h", "newline_tokens"], ["newlines"]),
        helper.make_node("Add", ["crop_tokens", "newlines"], ["partial_count"]),
        helper.make_node("Add", ["partial_count", "one"], ["counts_2d"]),
        helper.make_node("Reshape", ["counts_2d", "flat"], ["counts"]),
        # Row r belongs to image i when ends[i-1] <= r < ends[i]
        helper.make_node("CumSum", ["counts", "axis0"], ["ends"]),
        helper.make_node("ReduceSum", ["counts", "axis0_1d"], ["total_1d"], keepdims=1),
        helper.make_node("Squeeze", ["total_1d"], ["total"]),
        helper.make_node("Range", ["zero", "total", "one"], ["rows"]),
        helper.make_node("Unsqueeze", ["rows", "minus_one"], ["rows_col"]),
        helper.make_node("GreaterOrEqual", ["rows_col", "ends"], ["past"]),
        helper.make_node("Cast", ["past"], ["past_int"], to=i64),
        helper.make_node("ReduceSum", ["past_int", "minus_one"], ["image_of_row"], keepdims=0),
        helper.make_node("Sub", ["ends", "counts"], ["starts"]),
        helper.make_node("Gather", ["starts", "image_of_row"], ["row_start"]),
        helper.make_node("Sub", ["rows", "row_start"], ["in_image"]),
        helper.make_node("Mod", ["in_image", "crops"], ["crop_of_row"]),
        helper.make_node("Mul", ["image_of_row", "crops"], ["first_crop"]),
        helper.make_node("Add", ["first_crop", "crop_of_row"], ["crop_index"]),
        helper.make_node("Gather", ["crop_features", "crop_index"], ["image_features"]),
    ]
    initializers = [
        helper.make_tensor("cells_shape", i64, [6], [-1, 3, POOL, cell, POOL, cell]),
        helper.make_tensor("cell_axes", i64, [2], [3, 5]),
        helper.make_tensor("descriptor_shape", i64, [2], [-1, features]),
        helper.make_tensor("projection", f32, list(projection.shape), projection.ravel()),
        helper.make_tensor("side", i64, [], [SIDE]),
        helper.make_tensor("one", i64, [], [1]),
        helper.make_tensor("zero", i64, [], [0]),
        helper.make_tensor("tokens_per_crop", i64, [], [tokens]),
        helper.make_tensor("newline_tokens", i64, [], [NEWLINE_TOKENS]),
        helper.make_tensor("flat", i64, [1], [-1]),
        helper.make_tensor("axis0", i64, [], [0]),
        helper.make_tensor("axis0_1d", i64, [1], [0]),
        helper.make_tensor("minus_one", i64, [1], [-1]),
        helper.make_tensor("crops", i64, [], [CROPS]),
    ]
    inputs = [
        helper.make_tensor_value_info("pixel_values", f32, ["num_images", CROPS, 3, SIDE, SIDE]),
        helper.make_tensor_value_info("image_sizes", i64, ["num_images", 2]),
    ]
    outputs = [
        helper.make_tensor_value_info("image_features", f32, ["num_image_tokens", shape.hidden])
    ]
    return _model(helper.make_graph(nodes, "vision", inputs, outputs, initializers))

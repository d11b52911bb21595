"""What an image costs on a vision model: `python -m scripts.bench images`.

    python -m scripts.bench images                        # Phi-3-mini's shapes (generated once)
    python -m scripts.bench images --preset tiny-vision   # a quick look

One sidecar on a generated `phi3v` folder (scripts/models/modelgen/vision.py). For each image
size, interleaved, `reps` times: a chat that sends one image and a few words, and a text-only
chat whose prompt has as many tokens; each asks for one token (`/v1/chat/completions`,
streamed), so the time to it is the time the image costs before the first word. The image's
own work before the decoder (decoding the PNG, the HD transform's 17 crops, the vision graph,
the embedding) is the difference between the two.

The generated vision graph is cheap (pooling and a small MatMul), where the published
Phi-3.5-vision runs CLIP ViT-L/14 at 336 pixels on each of the 17 crops. That encoder's time
is not measured here (no such weights can be made or fetched offline); it is estimated: its
multiply-adds from its published shapes, at the fp32 MatMul rate onnxruntime reaches on this
CPU, measured on a MatMul of the encoder's own shapes. The table labels it as an estimate.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from scripts.bench.common import ensure_model
from scripts.bench.drivers import ChatTokenizer, sized_messages
from scripts.run import services
from sidecar.model.cpus import cpu_budget
from sidecar.model.vision import image_tokens

# CLIP ViT-L/14 at 336 pixels (Phi-3.5-vision's image encoder): 577 positions a crop
# (24 x 24 patches and the class token), 24 layers, width 1024, MLP 4096; 17 crops an image.
CLIP_POSITIONS, CLIP_LAYERS, CLIP_WIDTH, CLIP_MLP, CROPS = 577, 24, 1024, 4096, 17
SIZES = ("336x336", "640x480", "1280x720", "1344x1344", "200x3000")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a phi3v model folder (default: the generated --preset)")
    presets = ["phi3-mini-vision", "tiny-vision"]
    p.add_argument("--preset", default=presets[0], choices=presets)
    p.add_argument("--sizes", default=",".join(SIZES), help="WxH,WxH,... (default: %(default)s)")
    p.add_argument("--reps", type=int, default=2)


def clip_flops() -> float:
    """Multiply-adds x 2 of CLIP ViT-L/14-336 over one image's 17 crops (the projections,
    the MLP and attention's two products; norms and softmax are noise beside them)."""
    n, d, m = CLIP_POSITIONS, CLIP_WIDTH, CLIP_MLP
    per_layer = 4 * n * d * d + 2 * n * d * m + 2 * n * n * d
    return 2.0 * per_layer * CLIP_LAYERS * CROPS


def matmul_rate(threads: int) -> float:
    """fp32 FLOP/s of onnxruntime's MatMul on this CPU at CLIP's MLP shapes (the bulk of its
    work), the best of five runs after a warm-up."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    n, d, m = CLIP_POSITIONS * CROPS, CLIP_WIDTH, CLIP_MLP
    weight = np.random.default_rng(0).standard_normal((d, m)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "clip_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, m])],
        [helper.make_tensor("w", TensorProto.FLOAT, [d, m], weight.tobytes(), raw=True)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((n, d)).astype(np.float32)
    session.run(None, {"x": x})
    best = min(_timed(lambda: session.run(None, {"x": x})) for _ in range(5))
    return 2.0 * n * d * m / best


def _timed(call: Any) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def png_data_url(width: int, height: int, seed: int) -> str:
    """A photo-like PNG (smooth colour fields and noise), as the page would send one."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * (i + 1) + y * (3 - i)) % 256 for i in range(3)], axis=-1)
    pixels = (base + rng.integers(0, 32, (height, width, 3))).clip(0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def first_token(client: httpx.Client, url: str, content: Any) -> dict[str, Any]:
    """One streamed chat of one token: its time to first token and its usage."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c["delta"].get("content") for c in chunk["choices"]):
                first = time.perf_counter() - start
            usage = chunk.get("usage") or usage
    return {"ttft_s": first if first is not None else time.perf_counter() - start, "usage": usage}


def main(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        args.model = args.model or ensure_model(args, Path(scratch))
        tokenizer = ChatTokenizer.load(str(args.model))
        log = Path(scratch) / "sidecar.log"
        rows: list[dict[str, Any]] = []
        with services.sidecar(args.model, log) as sidecar, httpx.Client(timeout=1800) as client:
            for width, height in sizes:
                row: dict[str, Any] = {"size": f"{width}x{height}", "image": [], "text": []}
                for rep in range(args.reps):
                    parts = [
                        {
                            "type": "image_url",
                            "image_url": {"url": png_data_url(width, height, rep)},
                        },
                        {"type": "text", "text": "What is in this picture?"},
                    ]
                    image = first_token(client, sidecar.url, parts)
                    prompt_tokens = int(image["usage"].get("prompt_tokens", 0))
                    text = sized_messages(tokenizer, prompt_tokens, 900 + rep)[0]["content"]
                    plain = first_token(client, sidecar.url, text)
                    row["image"].append(image)
                    row["text"].append(plain)
                    print(
                        f"  {width}x{height} rep {rep}: {prompt_tokens} prompt tokens, TTFT "
                        f"image {image['ttft_s']:.2f} s, text {plain['ttft_s']:.2f} s",
                        flush=True,
                    )
                rows.append(_summary(row, width, height))
    rate = matmul_rate(cpu_budget().count)  # the sidecar's own thread count
    encoder_s = clip_flops() / rate
    for line in markdown(rows, encoder_s, rate):
        print(line)
    return {"model": str(args.model), "rows": rows, "clip_encoder_estimate_s": encoder_s,
            "matmul_flops": rate}  # fmt: skip


def _summary(row: dict[str, Any], width: int, height: int) -> dict[str, Any]:
    image_ttft = statistics.median(s["ttft_s"] for s in row["image"])
    text_ttft = statistics.median(s["ttft_s"] for s in row["text"])
    usage = row["image"][0]["usage"]
    details = usage.get("prompt_tokens_details") or {}
    return {
        "size": row["size"],
        "image_tokens": int(details.get("image_tokens", 0)),
        "formula_tokens": image_tokens(width, height),
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
        "ttft_image_s": image_ttft,
        "ttft_text_s": text_ttft,
        "samples": {k: row[k] for k in ("image", "text")},
    }


def markdown(rows: list[dict[str, Any]], encoder_s: float, rate: float) -> list[str]:
    lines = [
        "",
        "| image | image tokens | prompt tokens | TTFT with the image (s) | TTFT, text of as "
        "many tokens (s) | the image's own work (s) | + CLIP ViT-L/14 encoder, estimate (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        own = r["ttft_image_s"] - r["ttft_text_s"]
        lines.append(
            f"| {r['size']} | {r['image_tokens']:,} | {r['prompt_tokens']:,} | "
            f"{r['ttft_image_s']:.2f} | {r['ttft_text_s']:.2f} | {own:.2f} | {encoder_s:.1f} |"
        )
    lines += [
        "",
        f"The encoder estimate: {clip_flops() / 1e12:.2f} TFLOP an image (17 crops) at "
        f"{rate / 1e9:.0f} GFLOP/s (onnxruntime fp32 MatMul at CLIP's MLP shapes, this CPU).",
    ]
    return lines

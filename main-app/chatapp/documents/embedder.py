"""Vectors from the model service: `POST /v1/embeddings` in OpenAI's shape.

The same URL and key as the chat (`SIDECAR_URL`, `UPSTREAM_API_KEY`): our sidecar serves it
when it has an encoder (`EMBED_MODEL_PATH`); with `UPSTREAM_API=openai`, any
OpenAI-compatible server that does (Ollama, llama.cpp's `llama-server --embeddings`).
`EMBED_MODEL` is the `model` field sent (Ollama needs the encoder's name; our sidecar takes
any). Vectors come back normalised to unit length here, so cosine similarity is a dot product
whatever the server does.

Passages are embedded as passages and questions as queries: to our sidecar (`send_input_type`,
documents/service.py: not `UPSTREAM_API=openai`) each request says which in `input_type`, its
extension, and the sidecar writes the encoder's prompt for it (e5's "passage: ", "query: ";
none for all-MiniLM-L6-v2). Other servers get OpenAI's fields only, as upstream_openai.py sends
them (an unknown field may be refused there).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

import numpy as np
import requests

InputType = Literal["passage", "query"]


class EmbeddingsFailed(Exception):
    """The model service gave no vectors: one sentence, safe to show."""


class Embedder:
    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        timeout: float = 120.0,
        batch: int = 32,
        send_input_type: bool = False,
    ) -> None:
        # Our sidecar's root and an OpenAI-compatible server's /v1 both work as SIDECAR_URL.
        self.url = base_url.rstrip("/").removesuffix("/v1") + "/v1/embeddings"
        self.model = model
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout
        self.batch = batch
        self.send_input_type = send_input_type

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One unit vector per passage of the library (rows in order), float32."""
        return self._vectors(texts, "passage")

    def embed_query(self, question: str) -> np.ndarray:
        """The unit vector of a question searched for, float32."""
        vector: np.ndarray = self._vectors([question], "query")[0]
        return vector

    def _vectors(self, texts: Sequence[str], input_type: InputType) -> np.ndarray:
        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch):
            rows.extend(self._call(list(texts[start : start + self.batch]), input_type))
        matrix = np.asarray(rows, dtype=np.float32)
        if matrix.ndim != 2 or len(matrix) != len(texts):
            raise EmbeddingsFailed("The model service answered with the wrong number of vectors.")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        return matrix / np.maximum(norms, 1e-12)

    def _call(self, texts: list[str], input_type: InputType) -> list[list[float]]:
        fields: dict[str, object] = {"input": texts, "model": self.model}
        if self.send_input_type:
            fields["input_type"] = input_type
        body = json.dumps(fields, ensure_ascii=False).encode()
        try:
            response = requests.post(
                self.url, data=body, headers=self.headers, timeout=(5.0, self.timeout)
            )
        except requests.RequestException:
            raise EmbeddingsFailed("The model service is not reachable for embeddings.") from None
        if response.status_code != 200:
            raise EmbeddingsFailed(_refusal(response))
        try:
            data = sorted(response.json()["data"], key=lambda item: item["index"])
            return [list(map(float, item["embedding"])) for item in data]
        except (ValueError, KeyError, TypeError):
            raise EmbeddingsFailed("The model service's embeddings were not readable.") from None


def _refusal(response: requests.Response) -> str:
    """The service's own sentence when it sent one (its error envelope), else the status."""
    try:
        message = response.json()["error"]["message"]
        if isinstance(message, str) and message:
            return f"The model service refused the embeddings ({response.status_code}): {message}"
    except (ValueError, KeyError, TypeError):
        pass
    return f"The model service refused the embeddings ({response.status_code})."

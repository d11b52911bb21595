"""What is particular to the loaded model, read from its folder and its template: the token ids
that end a reply, the added tokens that user text must never become, BOS, and whether its chat
template has a system role. Nothing here names a family: Phi-3, Llama 3, Qwen2, Mistral and
Gemma differ in all of these, so each is taken from the model's own files and template.

End of a reply: any id in genai_config.json's eos_token_id, the tokenizer's EOS ids,
generation_config.json's eos_token_id (when the folder has one), and the token the chat
template writes right after an assistant message (Phi-3's <|end|>, Llama 3's <|eot_id|>,
Qwen's <|im_end|>, Gemma's <end_of_turn>). A folder whose config lists only the end-of-text
token (as exports of several families do) would otherwise let the model write the next turn
itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.model.folder import read_json
from sidecar.model.prompt.builder import Tokenizer, added_tokens_of


@dataclass(frozen=True)
class ModelFacts:
    model_type: str  # genai_config.json's model.type: phi3, llama, qwen2, mistral, gemma2, ...
    eos_ids: frozenset[int]
    end_of_turn: str | None  # the added token the template closes an assistant turn with
    added_tokens: Mapping[str, int]  # every added token (special or not): never from user text
    bos_id: int | None
    system_role: bool  # False: the template refuses a system message
    # The smallest KV cache a generation may have: the attention window of a model with
    # sliding-window layers (Gemma 2: 4096), which onnxruntime refuses to run with less.
    min_cache_length: int = 0

    def log_fields(self) -> dict[str, Any]:
        """What the model worker logs once at load."""
        return {
            "model_type": self.model_type,
            "eos_ids": sorted(self.eos_ids),
            "end_of_turn": self.end_of_turn,
            "system_role": self.system_role,
            "bos_id": self.bos_id,
            "min_cache_length": self.min_cache_length,
        }


def read_facts(
    path: Path,
    genai_config: Mapping[str, Any],
    tokenizer: Tokenizer,
    tokenizer_eos: Iterable[int],
    tokenizer_bos: int,
) -> ModelFacts:
    """The facts of the model in `path` (genai_config.json already parsed and checked)."""
    model = genai_config["model"]
    added = added_tokens_of(
        [read_json(path / "tokenizer.json"), read_json(path / "tokenizer_config.json")]
    )
    end_of_turn = _end_of_turn(tokenizer, added)
    generation = read_json(path / "generation_config.json")
    eos = {
        *(int(i) for i in tokenizer_eos),
        *_ids(model.get("eos_token_id")),
        *_ids(generation.get("eos_token_id") if isinstance(generation, dict) else None),
        *([added[end_of_turn]] if end_of_turn is not None else []),
    }
    return ModelFacts(
        model_type=str(model.get("type", "")),
        eos_ids=frozenset(eos),
        end_of_turn=end_of_turn,
        added_tokens=added,
        bos_id=int(tokenizer_bos) if int(tokenizer_bos) >= 0 else None,
        system_role=_renders(tokenizer, [("system", "s"), ("user", "u")]),
        min_cache_length=_window(model),
    )


def _window(model: Mapping[str, Any]) -> int:
    """genai_config.json's sliding window, if any layer uses it (the builder lists them)."""
    window = model.get("decoder", {}).get("sliding_window")
    if not isinstance(window, dict) or window.get("layers") == []:
        return 0
    size = window.get("window_size")
    return min(int(size), int(model["context_length"])) if isinstance(size, int) else 0


def _ids(value: object) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [int(i) for i in value if isinstance(i, int)]
    return []


def _renders(tokenizer: Tokenizer, messages: list[tuple[str, str]]) -> bool:
    try:
        _render(tokenizer, messages, generation_prompt=True)
    except Exception:
        return False
    return True


def _render(tokenizer: Tokenizer, messages: list[tuple[str, str]], generation_prompt: bool) -> str:
    as_json = json.dumps([{"role": role, "content": content} for role, content in messages])
    return tokenizer.apply_chat_template(as_json, add_generation_prompt=generation_prompt)


_MARK = "\ue000end-of-turn-probe\ue001"


def _end_of_turn(tokenizer: Tokenizer, added: Mapping[str, int]) -> str | None:
    """The first added token the template writes after an assistant message's content,
    with at most whitespace between them."""
    if not added:
        return None
    try:
        text = _render(tokenizer, [("user", "u"), ("assistant", _MARK)], generation_prompt=False)
    except Exception:
        return None
    at = text.find(_MARK)
    if at < 0:
        return None
    names = sorted(added, key=len, reverse=True)
    match = re.compile(r"\s*(" + "|".join(map(re.escape, names)) + ")").match(text, at + len(_MARK))
    return match.group(1) if match else None

"""What makes each family different, as its published instruct model has it: the transformers
config (shrunk to a few layers), the special tokens, the end-of-turn and end-of-text ids in
config.json and generation_config.json, BOS handling, and the chat template, word for word.

The templates are the published ones (templates/*.jinja; see each Family's `modelled_on`);
the special token strings are the real ones; their ids are small because the vocabularies are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from scripts.models.hfgen.tokenizer import Style
from scripts.models.modelgen.tokenizer import CHAT_TEMPLATE as PHI3_TEMPLATE
from scripts.models.modelgen.vocab import SPECIALS as PHI3_SPECIALS

TEMPLATES = Path(__file__).parent / "templates"

# Every family: 2 layers, hidden 64, grouped-query attention where the family has it. Weights
# drawn 10x wider than transformers' default: at the default, a model with tied embeddings
# repeats the prompt's last token for ever (its output is its input's embedding).
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "initializer_range": 0.2,
}


@dataclass(frozen=True)
class Family:
    name: str
    modelled_on: str  # the Hugging Face model whose facts these are
    model_type: str  # transformers' config.model_type
    genai_type: str  # genai_config.json's model.type after the builder
    style: Style
    config: dict[str, Any]  # transformers config fields beyond TINY
    leading: tuple[str, ...]  # special tokens with the first ids
    specials: tuple[tuple[str, bool], ...]  # added tokens after the vocabulary: (text, special)
    bos: str | None  # the tokenizer's bos_token (None: the family has none)
    eos: str  # the tokenizer's eos_token
    config_eos: tuple[str, ...]  # config.json's eos_token_id
    generation_eos: tuple[str, ...]  # generation_config.json's eos_token_id
    end_of_turn: str  # what the template writes after an assistant message
    template_file: str = ""
    template_text: str = ""
    pad: str | None = None
    unk: str | None = None
    tokenizer_class: str = "PreTrainedTokenizerFast"
    add_bos_token: bool | None = None
    merges: int = 240
    # Multiplies the output rows of the end tokens: random weights then end a greedy reply
    # within a few tokens for some prompts and run on for others (tests want both). Found by
    # trying: the smallest of 1.3, 1.5, 2.0 that gives both for most of a dozen prompts.
    eot_boost: float = 1.5
    extra_tokenizer_config: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def chat_template(self) -> str:
        if self.template_text:
            return self.template_text
        return (TEMPLATES / self.template_file).read_text(encoding="utf-8")

    @property
    def system_role(self) -> bool:
        """Whether the template takes a system message (Gemma's raises an error)."""
        return self.name != "gemma"


LLAMA3_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)
QWEN2_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
QWEN2_ADDED = (  # added tokens that are not special (they decode as text)
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)

FAMILIES = {
    f.name: f
    for f in [
        Family(
            name="llama",
            modelled_on="meta-llama/Llama-3.2-1B-Instruct",
            model_type="llama",
            genai_type="llama",
            style="byte_level",
            config={
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 4096,
                "rope_theta": 500000.0,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 32.0,
                    "high_freq_factor": 4.0,
                    "low_freq_factor": 1.0,
                    "original_max_position_embeddings": 256,
                },
                "tie_word_embeddings": True,
                "rms_norm_eps": 1e-5,
            },
            leading=(),
            specials=tuple((t, True) for t in LLAMA3_SPECIALS),
            bos="<|begin_of_text|>",
            eos="<|eot_id|>",
            config_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
            generation_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
            end_of_turn="<|eot_id|>",
            template_file="llama3.2.jinja",
        ),
        Family(
            name="qwen2",
            modelled_on="Qwen/Qwen2.5-0.5B-Instruct",
            model_type="qwen2",
            genai_type="qwen2",
            style="byte_level",
            config={
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 4096,
                "rope_theta": 1000000.0,
                "tie_word_embeddings": True,
                "rms_norm_eps": 1e-6,
                "use_sliding_window": False,
            },
            leading=(),
            specials=(
                *((t, True) for t in QWEN2_SPECIALS),
                *((t, False) for t in QWEN2_ADDED),
            ),
            bos=None,
            eos="<|im_end|>",
            pad="<|endoftext|>",
            config_eos=("<|im_end|>",),
            generation_eos=("<|im_end|>", "<|endoftext|>"),
            end_of_turn="<|im_end|>",
            template_file="qwen2.5.jinja",
            tokenizer_class="Qwen2Tokenizer",
            extra_tokenizer_config={"errors": "replace", "split_special_tokens": False},
        ),
        Family(
            name="mistral",
            modelled_on="mistralai/Mistral-7B-Instruct-v0.2",
            model_type="mistral",
            genai_type="mistral",
            style="sentencepiece",
            config={
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 4096,
                "rope_theta": 1000000.0,
                "sliding_window": None,
                "tie_word_embeddings": False,
                "rms_norm_eps": 1e-5,
            },
            leading=("<unk>", "<s>", "</s>"),
            specials=(),
            bos="<s>",
            eos="</s>",
            unk="<unk>",
            config_eos=("</s>",),
            generation_eos=("</s>",),
            end_of_turn="</s>",
            template_file="mistral-v0.2.jinja",
            tokenizer_class="LlamaTokenizer",
            add_bos_token=True,
            extra_tokenizer_config={"legacy": False, "spaces_between_special_tokens": False},
        ),
        Family(
            name="phi3",
            modelled_on="microsoft/Phi-3-mini-4k-instruct",
            model_type="phi3",
            genai_type="phi3",
            style="sentencepiece",
            config={
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "max_position_embeddings": 4096,
                "original_max_position_embeddings": 4096,
                "rope_theta": 10000.0,
                "tie_word_embeddings": False,
                "rms_norm_eps": 1e-5,
                "sliding_window": 2047,
            },
            leading=("<unk>", "<s>", "</s>"),
            specials=tuple((t, True) for t in PHI3_SPECIALS),
            bos="<s>",
            eos="<|endoftext|>",
            pad="<|endoftext|>",
            unk="<unk>",
            config_eos=("<|endoftext|>",),
            generation_eos=("<|endoftext|>", "<|assistant|>", "<|end|>"),
            end_of_turn="<|end|>",
            template_text=PHI3_TEMPLATE,
            tokenizer_class="LlamaTokenizer",
            add_bos_token=False,
            extra_tokenizer_config={"legacy": False},
        ),
        Family(
            name="gemma",
            modelled_on="google/gemma-2-2b-it",
            model_type="gemma2",
            genai_type="gemma2",
            style="gemma",
            config={
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "query_pre_attn_scalar": 16,
                "max_position_embeddings": 4096,
                "sliding_window": 512,
                # Gemma multiplies embeddings by sqrt(hidden): wider weights make it echo.
                "initializer_range": 0.02,
                "tie_word_embeddings": True,
                "rms_norm_eps": 1e-6,
            },
            leading=("<pad>", "<eos>", "<bos>", "<unk>", "<mask>"),
            specials=(("<start_of_turn>", True), ("<end_of_turn>", True)),
            bos="<bos>",
            eos="<eos>",
            pad="<pad>",
            unk="<unk>",
            config_eos=("<eos>",),
            generation_eos=("<eos>", "<end_of_turn>"),
            end_of_turn="<end_of_turn>",
            template_file="gemma2.jinja",
            tokenizer_class="GemmaTokenizer",
            add_bos_token=True,
            eot_boost=2.0,
        ),
    ]
}

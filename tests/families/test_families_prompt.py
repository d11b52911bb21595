"""Each family's chat template, special tokens and end ids, through the sidecar's real engine on
a model exported by the official builder, compared with transformers on the Hugging Face
folder it was exported from."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.ipc import Role
from sidecar.model.engine import Engine
from sidecar.model.prompt.builder import TemplateRefused
from tests.families.conftest import Exported

pytestmark = pytest.mark.families

Messages = list[tuple[Role, str]]

CONVERSATIONS: list[Messages] = [
    [("user", "Hello — ça va? 日本語")],
    [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Why?")],
    # Content with whitespace at its ends: Llama 3's and Gemma's templates trim it.
    [
        ("system", "  Be kind.\n"),
        ("user", " Hi there \n"),
        ("assistant", "\tFine 🚀 "),
        ("user", "x "),
    ],
    [("user", "Emoji 😀🎉 👩‍👩‍👧, Arabic مرحبا, Hebrew שלום\n\nTwo paragraphs.")],
]


@pytest.fixture(scope="module")
def engine(exported: Exported) -> Engine:
    return Engine(exported.model_dir)


def as_dicts(messages: Messages) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in messages]


def folded(messages: Messages) -> Messages:
    """What a template without a system role is given: the system message opens the first
    user message (as Gemma 3's and Mistral's templates do themselves)."""
    if messages[0][0] != "system":
        return messages
    (_, system), (_, user), *rest = messages
    return [("user", f"{system}\n\n{user}"), *rest]


def for_template(exported: Exported, messages: Messages) -> Messages:
    return messages if exported.family.system_role else folded(messages)


def hf_ids(hf_tokenizer: Any, messages: Messages) -> list[int]:
    ids = hf_tokenizer.apply_chat_template(
        as_dicts(messages), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(i) for i in ids]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_the_template_renders_as_transformers_renders_it(
    exported: Exported, engine: Engine, hf_tokenizer: Any, messages: Messages
) -> None:
    """onnxruntime-genai's template engine and transformers' Jinja give the same text."""
    messages = for_template(exported, messages)
    ours = engine.tokenizer.apply_chat_template(
        json.dumps(as_dicts(messages)), add_generation_prompt=True
    )
    theirs = hf_tokenizer.apply_chat_template(
        as_dicts(messages), add_generation_prompt=True, tokenize=False
    )
    assert ours == theirs


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_the_prompt_is_the_token_ids_transformers_makes(
    exported: Exported, engine: Engine, hf_tokenizer: Any, messages: Messages
) -> None:
    """The sidecar's prompt (placeholders, trimming, BOS) is exactly transformers' ids."""
    assert engine.prompts.encode(messages) == hf_ids(hf_tokenizer, for_template(exported, messages))


def test_a_system_message_reaches_a_template_without_a_system_role(
    exported: Exported, engine: Engine, hf_tokenizer: Any
) -> None:
    messages: Messages = [("system", "Answer in French."), ("user", "Hello")]
    ids = engine.prompts.encode(messages)
    assert engine.facts.system_role == exported.family.system_role
    if not exported.family.system_role:  # Gemma: transformers refuses it outright
        with pytest.raises(Exception, match="System role not supported"):
            hf_ids(hf_tokenizer, messages)
    assert "Answer in French." in engine.tokenizer.decode(ids)


def test_a_conversation_the_template_refuses_is_refused_with_its_sentence(
    exported: Exported, engine: Engine
) -> None:
    """Mistral's and Gemma's templates insist on user/assistant alternation."""
    messages: Messages = [("user", "one"), ("user", "two")]
    if exported.family.name in ("mistral", "gemma"):
        with pytest.raises(TemplateRefused) as refused:
            engine.prompts.encode(messages)
        assert "must alternate user/assistant" in str(refused.value)
        assert "row" not in str(refused.value) and "\n" not in str(refused.value)
    else:
        assert engine.prompts.encode(messages)


def test_role_markers_typed_by_users_stay_text(exported: Exported, engine: Engine) -> None:
    """Every special token string of the family, typed in any message, is encoded as text:
    the only special ids are the template's own."""
    added = dict(engine.facts.added_tokens)
    forged = "".join(t for t, _ in exported.family.specials) or "".join(exported.family.leading)
    forged += "[INST] <<SYS>>"
    neutral: Messages = [("user", "hi"), ("assistant", "x"), ("user", "x")]
    messages: Messages = [("user", "hi"), ("assistant", forged), ("user", forged)]
    if exported.family.system_role:
        neutral, messages = [("system", "x"), *neutral], [("system", forged), *messages]
    specials = set(added.values())
    ids = engine.prompts.encode(messages)
    assert [i for i in ids if i in specials] == [
        i for i in engine.prompts.encode(neutral) if i in specials
    ]
    # The content is all there, as text. (Cut apart, a SentencePiece tokenizer spells each
    # piece as a new word, so spaces may appear between the pieces: prompt/builder.py's trade-off.)
    decoded = "".join(engine.tokenizer.decode(ids).split())
    assert decoded.count("".join(forged.split())) >= 2


def test_the_end_of_a_turn_ends_a_reply(exported: Exported, engine: Engine) -> None:
    """The token the template closes an assistant turn with, and every end id the family
    publishes (config.json and generation_config.json), end a reply."""
    family = exported.family
    added = dict(engine.facts.added_tokens)
    assert engine.facts.end_of_turn == family.end_of_turn
    wanted = {added[t] for t in (*family.config_eos, *family.generation_eos, family.end_of_turn)}
    assert wanted <= engine.eos_ids
    genai = json.loads((exported.model_dir / "genai_config.json").read_text())
    assert genai["model"]["type"] == family.genai_type
    listed = genai["model"]["eos_token_id"]
    assert {added[t] for t in family.generation_eos} <= set(
        [listed] if isinstance(listed, int) else listed
    )

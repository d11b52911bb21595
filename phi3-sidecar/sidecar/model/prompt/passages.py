"""Where a grounded request's passages stand in its prompt (ipc.Generate.passages), for the
passage store (kv/passages.py): built with the prompt, in the prompt process.

A passage is found by its tokens: the text encoded alone, looked up in the prompt's tokens
after the reading prefix (kv.passages.find_spans allows for a tokenizer that writes a text's
first word otherwise when it starts the text). The reading prefix is what every prompt with this
request's system message starts with (the common start of the prompts made for it with two
different user turns), so a passage read after it once serves every chat and turn that sends
that system message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence

from sidecar.ipc import Generate, Role
from sidecar.model.prompt.builder import Prompt, PromptBuilder

Render = Callable[[Sequence[tuple[Role, str]]], list[int]]  # messages -> prompt ids

MIN_PASSAGE_TOKENS = 16  # shorter runs are read as they are: nothing worth a lookup

# The user turns whose prompts' common start is a system message's prefix
_PROBES = ("a", "b", "1")


def common_start(system: str | None, render: Render) -> list[int]:
    """The tokens every prompt that opens with this system message (None: none) starts with:
    the common start of the prompts `render` makes for it with different user turns."""
    opening: tuple[tuple[Role, str], ...] = () if system is None else (("system", system),)
    prompts = [render((*opening, ("user", probe))) for probe in _PROBES]
    common = 0
    for tokens in zip(*prompts, strict=False):
        if len(set(tokens)) > 1:
            break
        common += 1
    return prompts[0][:common]


def built(builder: PromptBuilder, request: Generate, max_length: int) -> Prompt:
    """The request's prompt (PromptBuilder.build) with its passages marked."""
    return mark(builder, request, builder.build(request, max_length), max_length)


def mark(builder: PromptBuilder, request: Generate, prompt: Prompt, max_length: int) -> Prompt:
    """The prompt with its passages' places and its reading prefix (unchanged without
    passages, for a plain prompt, or where the prompt does not start with the prefix)."""
    if not request.passages or request.prompt is not None or request.images:
        return prompt
    system = (
        request.messages[0][1]
        if request.messages[:1] and request.messages[0][0] == "system"
        else None
    )
    prefix = common_start(system, lambda turns: list(builder.fit(turns, 1, max_length).ids))
    if not prefix or prompt.ids[: len(prefix)] != prefix:
        return prompt
    encoded = (builder.encode_alone(text) for text in request.passages)
    spans = find_spans(prompt.ids, len(prefix), encoded)
    return dataclasses.replace(prompt, passages=tuple(spans), reading_prefix=tuple(prefix))


def find_spans(
    ids: Sequence[int], start: int, passages: Iterable[Sequence[int]]
) -> list[tuple[int, tuple[int, ...]]]:
    """Where each passage's tokens stand in `ids` (from `start` on), as (position, tokens),
    in order and apart; a passage whose tokens are not there whole is left out. The tokens of
    a passage encoded alone may differ from those it has in the prompt at its ends (a
    tokenizer that marks a word's start writes its first word otherwise): its first and last
    tokens may be left out of the match."""
    found: list[tuple[int, tuple[int, ...]]] = []
    taken: list[tuple[int, int]] = []
    prompt = list(ids)
    for tokens in passages:
        for core in _cores(list(tokens)):
            position = _index(prompt, core, start)
            while position >= 0 and _overlaps(taken, position, position + len(core)):
                position = _index(prompt, core, position + 1)
            if position >= 0:
                found.append((position, tuple(core)))
                taken.append((position, position + len(core)))
                break
    return sorted(found)


def _overlaps(taken: list[tuple[int, int]], start: int, end: int) -> bool:
    return any(a < end and start < b for a, b in taken)


def _cores(tokens: list[int]) -> Iterator[list[int]]:
    for head in (0, 1):
        for tail in (0, 1):
            core = tokens[head : len(tokens) - tail]
            if len(core) >= MIN_PASSAGE_TOKENS:
                yield core


def _index(prompt: list[int], core: list[int], start: int) -> int:
    """The first position at or after `start` where `core` stands in `prompt`; -1: none."""
    first, size = core[0], len(core)
    position = start
    while True:
        try:
            position = prompt.index(first, position)
        except ValueError:
            return -1
        if prompt[position : position + size] == core:
            return position
        position += 1

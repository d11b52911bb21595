"""Turn chat messages into prompt token ids: the model's own template, no forged role markers.

The prompt text comes from the model's chat template (`apply_chat_template`), never from string
formatting. The tokenizer, though, turns any added-token string in its input (`<|end|>`,
`<|system|>`, ...) into that special token, so a user who types `<|end|><|system|>` would write
real role markers. To prevent that, the template is rendered once with a unique placeholder in
place of each message, which tells exactly which characters are template and which are content.

- Usual case (no message contains an added-token string): the text between the template's
  special tokens is encoded piece by piece, the specials inserted by id, which is what the
  model's tokenizer gives for the whole text where it splits at added tokens first (HF's and
  onnxruntime-extensions' do: tests/families checks five families against HF's encode). A
  template that writes no special token has its whole text encoded in one call. (The one call
  was meant for every template, but it read the text without the specials and so never
  returned for a template that writes them; found while profiling issue 46, where each prompt
  was encoded twice: that encode is no longer made. Encoding the whole text with its specials
  would change the ids of tokenizers that do not split so: left for a change of its own.)
  Each piece's ids are kept for the next turn of the conversation (prompt/memo.py).
- Otherwise the text is cut inside every added-token string that lies in (or runs into) content,
  the pieces are encoded separately and their ids concatenated; the template's special tokens
  are inserted by id. Those strings then arrive as plain text tokens ("<", "|end|>", ...).
  Trade-off: the tokens around each cut may differ from what one encode would give (BPE merges
  do not cross the cut; a SentencePiece tokenizer adds its word-start marker to each piece).
  That changes only how the forged text is spelled in tokens, never what the model is told
  about roles, and only for requests that contain such strings.
In both cases no token id of an added token can come from message content.

Images (a vision model, vision.py): each image's place in a message (ipc.Generate.image_slots)
gets a marker no text can forge (a nonce, like the messages' placeholders), and the text is cut
there: the pieces are encoded separately, as the model's own processor encodes the text between
its tags, and the image stands in the ids as a run of its token count of the id -(i+1) (image i
of the request; vision.number_images numbers them as the processor does). Typed text that reads
like an image tag is text like any other. An image goes with its turn when older turns are
left out, and its tokens count towards the limit like any others.

What else a template does with content is followed, never assumed: each placeholder is padded
with whitespace, so the rendering shows whether the template trims content (Llama 3's and
Gemma's do: `| trim`), and the content is trimmed the same way. A model whose template has no
system role (Gemma's raises an error for one) gets the system message in front of the first
user message, separated by a blank line, as Mistral's and Gemma 3's templates do themselves.
An error the template raises (Gemma and Mistral insist that user and assistant alternate) is
a TemplateRefused with the template's own sentence.
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sidecar.ipc import Generate, Role
from sidecar.model.prompt.memo import PieceMemo


class Tokenizer(Protocol):
    def encode(self, text: str) -> Sequence[int]: ...

    def apply_chat_template(self, messages: str, add_generation_prompt: bool = True) -> str: ...


class PromptTooLong(Exception):
    def __init__(
        self, prompt_tokens: int, limit: int, image_tokens: int = 0, *, at_least: bool = False
    ) -> None:
        super().__init__(f"prompt of {prompt_tokens} tokens exceeds the limit of {limit}")
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        self.image_tokens = image_tokens  # of prompt_tokens, those that stand for images
        # True: refused by the byte bound (prompt/token_bound.py) before any tokenization, and
        # prompt_tokens is the least the prompt takes
        self.at_least = at_least

    def __reduce__(self) -> tuple[Any, ...]:  # it crosses from the prompt process
        args = (self.prompt_tokens, self.limit, self.image_tokens)
        return (PromptTooLong, args, {"at_least": self.at_least})


class UnsafePrompt(Exception):
    """The content could not be encoded: not without special token ids (never seen in
    practice), or not at all (a lone surrogate)."""


class TemplateRefused(Exception):
    """The model's chat template raised an error for these messages; str() is its sentence."""


@dataclass(frozen=True)
class Prompt:
    ids: list[int]  # negative ids: image slots (vision.number_images)
    dropped_messages: int
    max_new_tokens: int
    image_tokens: int = 0  # of ids, those that stand for images
    # Characters handed to the tokenizer to build it (each turn counted as often as it was
    # encoded): what fitting it cost; 0 for token ids
    encoded_chars: int = 0
    # A grounded request's passages (prompt/passages.py): where each stands and its tokens,
    # and the reading prefix the passage store reads them after (kv/passages.py)
    passages: tuple[tuple[int, tuple[int, ...]], ...] = ()
    reading_prefix: tuple[int, ...] = ()


@dataclass(frozen=True)
class ImagePlacement:
    """A request's images for the prompt: where each stands (ipc.Generate.image_slots), its
    prompt tokens (the processor's count), and the text the model's tag puts after each."""

    slots: Sequence[tuple[int, int]]
    tokens: Sequence[int]
    after: str = ""


@dataclass(frozen=True)
class _Image:
    index: int  # the request's image


Segment = str | int | _Image  # text, a template's special token id, an image


Message = tuple[Role, str]

# Around each placeholder: whitespace a template's `trim` removes and no template writes.
_PAD = " \t \t"
# onnxruntime-genai appends where in the template an error was raised, then the template.
_TEMPLATE_POSITION = re.compile(r"\s+at row \d+, column \d+:?$")


class PromptBuilder:
    def __init__(
        self,
        tokenizer: Tokenizer,
        added_tokens: Mapping[str, int],
        bos_id: int | None,
        *,
        system_role: bool = True,
        max_token_bytes: int | None = None,
        vocab_size: int = 0,
    ) -> None:
        self._tokenizer = tokenizer
        self.bos_id = bos_id
        self.system_role = system_role
        # The most bytes one token stands for (prompt/token_bound.py): the cheap check; None: none
        self.max_token_bytes = max_token_bytes
        self.encoded_chars = 0  # characters handed to the tokenizer, since start
        self.vocab_size = vocab_size  # a plain prompt's ids must be below it (0: unknown)
        self.added = dict(added_tokens)
        self._added_ids = frozenset(added_tokens.values())
        # Longest first, so the alternation prefers "<|endoftext|>" over a shorter prefix.
        names = sorted(added_tokens, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, names))) if names else None
        probe = list(tokenizer.encode("a"))
        # Tokenizers that put BOS in front of every encode(): keep it once, at the start.
        self._auto_bos = bos_id if probe and bos_id is not None and probe[0] == bos_id else None
        # A conversation's next turn encodes only the pieces it adds (prompt/memo.py)
        self.memo = PieceMemo(lambda piece: self._strip_bos(self._encode_text(piece)))

    def encode(self, messages: Sequence[Message], images: _ImageMarks | None = None) -> list[int]:
        segments = self._segments(self._fold_system(messages))
        if images is not None:
            marked = images.split(segments)
            if any(isinstance(s, _Image) for s in marked):
                return self._encode_cut(marked, images.tokens)
        # Without the template's special tokens in the text, one encode can return only for
        # a template that writes none (see the module's docstring)
        legit = [s for s in segments if isinstance(s, int)]
        if not legit and all(not self._has_added(s) for s in segments if isinstance(s, str)):
            text = "".join(self._text_of(s) for s in segments)
            ids = self._strip_bos(self._encode_text(text))
            if not any(i in self._added_ids for i in ids):
                return self._with_bos(ids)
        return self._encode_cut(segments)

    def fit(
        self,
        messages: Sequence[Message],
        max_new_tokens: int,
        max_length: int,
        images: ImagePlacement | None = None,
    ) -> Prompt:
        """Drop the oldest turns until prompt + max_new_tokens fits in max_length.

        The system message and the newest user message are never dropped; whole turns go (a
        user message with the replies that follow it, and their images). If even the shortest
        prompt leaves no room for max_new_tokens, the reply budget shrinks to what is left;
        with no room for a single token the request is refused (PromptTooLong).
        """
        for _, content in messages:
            if not _is_utf8(content):
                # A lone surrogate (the APIs refuse one in a message, but a tool's parameters
                # written into the prompt may hold one): the tokenizer would fail, quoting
                # the whole text in its error.
                raise UnsafePrompt("a message holds a lone surrogate")
        newest = newest_user_text(messages)
        if images is None and newest is not None:
            self._check_size(newest, max_length)  # the newest user message is never dropped
        before = self.encoded_chars
        marks = _ImageMarks(images) if images is not None and images.slots else None
        if marks is not None:
            messages = marks.insert(messages)
        system = [m for m in messages[:1] if m[0] == "system"]
        rest = list(messages[len(system) :])
        cuts = [0] + [i for i in range(1, len(rest)) if rest[i][0] == "user"]
        cuts = sorted(set(cuts) | {len(rest) - 1})
        encoded: dict[int, list[int]] = {}

        def ids_for(at: int) -> list[int]:
            """The prompt from cuts[at] on, each encoded once."""
            if at not in encoded:
                encoded[at] = self.encode(system + rest[cuts[at] :], marks)
            return encoded[at]

        def fits(at: int) -> bool:
            return len(ids_for(at)) + max_new_tokens <= max_length

        def prompt(at: int, budget: int) -> Prompt:
            ids = ids_for(at)
            spent = self.encoded_chars - before
            return Prompt(ids, cuts[at], budget, _image_count(ids), spent)

        # Fewer messages never means more tokens, so the first cut that fits is found by
        # bisection; the cuts whose user text alone cannot fit are passed over unread, and the
        # whole conversation (most requests) and the shortest (a refusal) are tried first, so
        # a request that fits whole or not at all is encoded once or twice, never log(n) times.
        lo, hi = 0, len(cuts) - 1
        if marks is None:  # an image's marker is not its tokens
            lo = self._first_possible(rest, cuts, max_new_tokens, max_length)
        if fits(lo):
            return prompt(lo, max_new_tokens)
        if not fits(hi):
            ids = ids_for(hi)
            if len(ids) + 1 > max_length:
                raise PromptTooLong(len(ids), max_length, _image_count(ids))
            return prompt(hi, max_length - len(ids))
        lo += 1  # lo does not fit, hi does
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid + 1
        return prompt(hi, max_new_tokens)

    def _first_possible(
        self, rest: Sequence[Message], cuts: Sequence[int], max_new_tokens: int, max_length: int
    ) -> int:
        """The first cut whose user messages' bytes alone do not rule it out (cheap; 0 without
        a byte bound); the last cut at most."""
        if self.max_token_bytes is None:
            return 0
        bound = self.max_token_bytes
        least = [least_tokens(text, bound) if role == "user" else 0 for role, text in rest]
        after = list(itertools.accumulate(reversed(least)))[::-1]  # after[i]: rest[i:]'s
        for at, cut in enumerate(cuts):
            if after[cut] + max_new_tokens <= max_length:
                return at
        return len(cuts) - 1

    def build(self, request: Generate, max_length: int) -> Prompt:
        """A text request's prompt: its chat's (fit), or its plain prompt's (plain)."""
        if request.prompt is not None:  # /v1/completions: no template
            return self.plain(request.prompt, request.max_new_tokens, max_length)
        return self.fit(request.messages, request.max_new_tokens, max_length)

    def plain(self, prompt: str | Sequence[int], max_new_tokens: int, max_length: int) -> Prompt:
        """A plain prompt (/v1/completions): the text encoded as the tokenizer encodes it (its
        BOS included; the whole text is the caller's, so an added-token string in it is that
        token, as in other servers' completions), or token ids as they are. Nothing can be
        dropped: a prompt with no room for one token is refused (PromptTooLong), and the reply
        budget shrinks to what is left."""
        if isinstance(prompt, str):
            if not _is_utf8(prompt):
                raise UnsafePrompt("the prompt holds a lone surrogate")
            self._check_size(prompt, max_length)
            ids = [int(i) for i in self._encode_text(prompt)]
        else:
            ids = list(prompt)
            if ids and self.vocab_size and max(ids) >= self.vocab_size:
                raise UnsafePrompt(f"token ids must be below {self.vocab_size}")
        if not ids:
            raise UnsafePrompt("the prompt encodes to no tokens")
        if len(ids) + 1 > max_length:
            raise PromptTooLong(len(ids), max_length)
        return Prompt(ids, 0, min(max_new_tokens, max_length - len(ids)))

    def encode_alone(self, text: str) -> list[int]:
        """A text's tokens as the tokenizer makes them for it alone (no BOS)."""
        return self._strip_bos(self._encode_text(text))

    # -- internals ---------------------------------------------------------------------------

    def _encode_text(self, text: str) -> list[int]:
        self.encoded_chars += len(text)
        return list(self._tokenizer.encode(text))

    def _check_size(self, text: str, max_length: int) -> None:
        rule_out(text, max_length, self.max_token_bytes)

    def _segments(self, messages: Sequence[Message]) -> list[str | int]:
        """Template specials as ids, everything else as text runs (content is marked)."""
        nonce = secrets.token_hex(8)
        marks = [f"\ue000{nonce}.{i}\ue001" for i in range(len(messages))]
        skeleton = [
            {"role": role, "content": _PAD + mark + _PAD}
            for (role, _), mark in zip(messages, marks, strict=True)
        ]
        rendered = self._render(json.dumps(skeleton))
        segments: list[str | int] = []
        pos = 0
        for (_, content), mark in zip(messages, marks, strict=True):
            at = rendered.find(mark, pos)
            if at < 0:  # a template may leave a message out; then so do we
                continue
            end = at + len(mark)
            # Whichever side of the padding the template kept, it keeps of the content too.
            if rendered.startswith(_PAD, end):
                end += len(_PAD)
            else:
                content = content.rstrip()
            if rendered.endswith(_PAD, pos, at):
                at -= len(_PAD)
            else:
                content = content.lstrip()
            self._add_template(segments, rendered[pos:at])
            self._add_text(segments, content)
            pos = end
        self._add_template(segments, rendered[pos:])
        if nonce in "".join(self._text_of(s) for s in segments if isinstance(s, str)):
            raise UnsafePrompt("the chat template reordered the messages")
        return segments

    def _fold_system(self, messages: Sequence[Message]) -> Sequence[Message]:
        """For a template without a system role: the system message opens the first user
        message instead."""
        if self.system_role or not messages or messages[0][0] != "system":
            return messages
        rest = list(messages[1:])
        for i, (role, content) in enumerate(rest):
            if role == "user":
                rest[i] = ("user", f"{messages[0][1]}\n\n{content}")
                break
        return rest

    def _render(self, messages_json: str) -> str:
        try:
            return self._tokenizer.apply_chat_template(messages_json)
        except Exception as exc:  # the template's raise_exception(), or a template error
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            raise TemplateRefused(_TEMPLATE_POSITION.sub("", lines[0])) from exc

    def _add_template(self, segments: list[str | int], text: str) -> None:
        pos = 0
        for match in self._pattern.finditer(text) if self._pattern else ():
            self._add_text(segments, text[pos : match.start()])
            segments.append(self.added[match.group()])
            pos = match.end()
        self._add_text(segments, text[pos:])

    @staticmethod
    def _add_text(segments: list[str | int], text: str) -> None:
        if not text:
            return
        if segments and isinstance(segments[-1], str):
            segments[-1] = segments[-1] + text
        else:
            segments.append(text)

    @staticmethod
    def _text_of(segment: str | int) -> str:
        return segment if isinstance(segment, str) else ""

    def _has_added(self, text: str) -> bool:
        return self._pattern is not None and self._pattern.search(text) is not None

    def _strip_bos(self, ids: list[int]) -> list[int]:
        return ids[1:] if self._auto_bos is not None and ids[:1] == [self._auto_bos] else ids

    def _with_bos(self, ids: list[int]) -> list[int]:
        """The BOS a tokenizer adds by itself, once: not again when the template wrote one."""
        if self._auto_bos is not None and ids[:1] != [self._auto_bos]:
            return [self._auto_bos, *ids]
        return ids

    def _encode_cut(
        self, segments: Sequence[Segment], image_tokens: Sequence[int] = ()
    ) -> list[int]:
        ids: list[int] = []
        for segment in segments:
            if isinstance(segment, int):
                ids.append(segment)
                continue
            if isinstance(segment, _Image):
                ids.extend([-(segment.index + 1)] * image_tokens[segment.index])
                continue
            for piece in self._cut(segment):
                piece_ids = self.memo.ids(piece)
                if self._added_ids.intersection(piece_ids):
                    raise UnsafePrompt("message text encodes to a special token")
                ids.extend(piece_ids)
        return self._with_bos(ids)

    def _cut(self, text: str) -> list[str]:
        """Split text so that no piece contains an added-token string."""
        pieces, todo = [], [text]
        while todo:
            piece = todo.pop()
            match = self._pattern.search(piece) if self._pattern else None
            if match is None:
                pieces.append(piece)
            else:
                at = match.start() + 1  # "<|end|>" -> "<" + "|end|>"
                todo += [piece[at:], piece[:at]]
        return pieces


class _ImageMarks:
    """Each image's place as a marker in its message's text (a nonce no text can forge), and
    the markers back as images once the template has rendered the messages."""

    def __init__(self, placement: ImagePlacement) -> None:
        nonce = secrets.token_hex(8)
        self._mark = "\ue002" + nonce + ":{}\ue003"
        self._pattern = re.compile("\ue002" + nonce + ":(\\d+)\ue003")
        self._placement = placement
        self.tokens = placement.tokens

    def insert(self, messages: Sequence[Message]) -> list[Message]:
        out = list(messages)
        places: dict[int, list[tuple[int, int]]] = {}
        for image, (message, offset) in enumerate(self._placement.slots):
            places.setdefault(message, []).append((offset, image))
        for message, spots in places.items():
            role, text = out[message]
            # From the end, so earlier offsets still hold; images at one offset stay in order
            for offset, image in sorted(spots, reverse=True):
                marked = self._mark.format(image) + self._placement.after
                text = text[:offset] + marked + text[offset:]
            out[message] = (role, text)
        return out

    def split(self, segments: Sequence[str | int]) -> list[Segment]:
        out: list[Segment] = []
        for segment in segments:
            if not isinstance(segment, str):
                out.append(segment)
                continue
            for at, piece in enumerate(self._pattern.split(segment)):
                if at % 2:
                    out.append(_Image(int(piece)))
                elif piece:
                    out.append(piece)
        return out


def least_tokens(text: str, max_token_bytes: int | None) -> int:
    """The fewest tokens `text` can take, whatever the template does around it (0 without a
    bound: prompt/token_bound.py)."""
    if max_token_bytes is None:
        return 0
    return -(-len(text.strip().encode("utf-8")) // max_token_bytes)


def rule_out(text: str, max_length: int, max_token_bytes: int | None) -> None:
    """The cheap check: PromptTooLong for text that cannot fit, before any tokenizer reads it
    (onnxruntime-genai's holds the GIL for the whole text: seconds for an adversary's 60 KB).
    Run on the newest user message (never left out) or a plain prompt."""
    least = least_tokens(text, max_token_bytes)
    if least + 1 > max_length:
        raise PromptTooLong(least, max_length, at_least=True)


def newest_user_text(messages: Sequence[Message]) -> str | None:
    return next((content for role, content in reversed(messages) if role == "user"), None)


def _image_count(ids: Sequence[int]) -> int:
    return sum(1 for i in ids if i < 0)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def added_tokens_of(config_files: Collection[object]) -> dict[str, int]:
    """Added tokens (special or not) from parsed tokenizer.json / tokenizer_config.json."""
    found: dict[str, int] = {}
    for data in config_files:
        if not isinstance(data, dict):
            continue
        for entry in data.get("added_tokens") or []:
            if isinstance(entry, dict) and isinstance(entry.get("content"), str):
                found[entry["content"]] = int(entry["id"])
        for key, entry in (data.get("added_tokens_decoder") or {}).items():
            if isinstance(entry, dict) and isinstance(entry.get("content"), str):
                found.setdefault(entry["content"], int(key))
    return {name: i for name, i in found.items() if name}

"""What the worker answers for a request it cannot start: each exception of building or
starting one (prompt/builder.py, vision.py, guidance.py) as its ipc.Rejected; the web process
picks the status (web/errors.py, REFUSALS)."""

from __future__ import annotations

from sidecar import ipc
from sidecar.model.guidance import GuidanceRefused
from sidecar.model.prompt.builder import PromptTooLong, TemplateRefused, UnsafePrompt
from sidecar.model.vision import ImageRefused


def rejection(request: ipc.Generate, exc: Exception) -> ipc.Rejected | None:
    """The refusal for `exc`; None for an exception no refusal names (the worker logs it and
    answers start_failed)."""
    key = request.key
    match exc:
        case PromptTooLong():
            # a plain prompt (/v1/completions) has no turns to leave out
            turns = " even with all older turns left out" if request.prompt is None else ""
            images = f" ({exc.image_tokens} of them for images)" if exc.image_tokens else ""
            least = "at least " if exc.at_least else ""
            message = (
                f"the prompt takes {least}{exc.prompt_tokens} tokens{images}{turns}; the limit "
                f"is {exc.limit} tokens for prompt and reply together"
            )
            return ipc.Rejected(
                key,
                "context_length_exceeded",
                message,
                limit_tokens=exc.limit,
                byte_bound=exc.at_least,
            )
        case ImageRefused():
            return ipc.Rejected(key, "invalid_image", str(exc))
        case UnsafePrompt():
            # A plain prompt's reason names no text (token ids, an empty encoding)
            said = f"the prompt cannot be read: {exc}" if request.prompt is not None else None
            return ipc.Rejected(key, "unencodable_prompt", said or "the messages cannot be encoded")
        case TemplateRefused():
            message = f"the model's chat template refuses these messages: {exc}"
            return ipc.Rejected(key, "unencodable_prompt", message)
        case GuidanceRefused():
            message = f"the model cannot follow this schema: {exc}"
            return ipc.Rejected(key, "invalid_guidance", message)
    return None

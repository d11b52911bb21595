"""The models a sidecar serves, by name: MODELS_FILE's [[models]] tables, or MODEL_PATH alone.

MODELS_FILE (TOML), one table per model:

    [[models]]
    id = "phi3-mini"                # what requests name (`model`), unique
    path = "/home/models/phi3"      # its folder, or a catalog name (MODEL_ID's: catalog.py)
    aliases = ["phi3", "default"]   # other names for it, unique too
    pinned = true                   # never unloaded; the first pinned model is the default
    system_prompt = "..."           # given to a conversation that has no system message
    temperature = 0.7               # for a request that sets none
    idle_unload_s = 600             # unloaded after this long unused (0: only to make room)
    kv_memory_mb = 1024             # its KV bound (KV_MEMORY_MB), counted in the budget
    passage_kv_mb = 256             # its passage store's RAM (PASSAGE_KV_MB), counted too
    thread_spinning = false         # THREAD_SPINNING (default: off when several models)

Each model runs in a worker process of its own, with the sidecar's settings but these: its
MODEL_PATH, MODEL_NAME (the id), KV_MEMORY_MB, PASSAGE_KV_MB, THREAD_SPINNING (off with several
models unless a table says otherwise), and PROMPT_CACHE_DIR/<id> (each
model's disk tier and passage store apart: a reply is never read from another model's K/V).

Without MODELS_FILE the one model of MODEL_PATH is the registry, served under any name as
before (`model` echoed, never refused); with it, a name neither an id nor an alias is 404
model_not_found, as OpenAI answers.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidecar import catalog
from sidecar.settings import Settings
from sidecar.web.errors import ApiError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
Name = Annotated[str, Field(pattern=f"^{NAME.pattern}$", max_length=128)]


class RegistryError(Exception):
    """MODELS_FILE cannot be used; str() says why in one sentence."""


class ModelTable(BaseModel):
    """One [[models]] table."""

    model_config = ConfigDict(strict=True, extra="forbid")

    id: Name
    path: Annotated[str, Field(min_length=1, max_length=4096)]
    aliases: list[Name] = Field(default_factory=list, max_length=32)
    pinned: bool = False
    system_prompt: Annotated[str, Field(min_length=1, max_length=100_000)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    idle_unload_s: Annotated[float, Field(ge=0.0)] = 0.0
    kv_memory_mb: Annotated[int, Field(ge=64, le=1024 * 1024)] = 1024
    passage_kv_mb: Annotated[int, Field(ge=0, le=1024 * 1024)] = 256
    # THREAD_SPINNING for its worker; None: off when several models are configured (a worker
    # that spins on after its reply slows the next model's first token: docs/benchmarks/models.md)
    thread_spinning: bool | None = None


class ModelsFile(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    models: list[ModelTable] = Field(min_length=1, max_length=64)


@dataclass(frozen=True)
class ModelEntry:
    id: str
    settings: Settings  # its worker's
    aliases: tuple[str, ...] = ()
    pinned: bool = False
    system_prompt: str | None = None
    temperature: float | None = None
    idle_unload_s: float = 0.0

    @property
    def booked_bytes(self) -> int:
        """What it may hold beyond its loaded weights: its KV bound and passage store."""
        return (self.settings.kv_memory_mb + self.settings.passage_kv_mb) * 2**20


@dataclass(frozen=True)
class Registry:
    entries: tuple[ModelEntry, ...]
    strict: bool  # MODELS_FILE: an unknown name is 404; else the one model under any name

    @property
    def default(self) -> ModelEntry:
        return next((e for e in self.entries if e.pinned), self.entries[0])

    def resolve(self, name: str | None) -> ModelEntry:
        """The model a request names (its id or an alias; None: the default)."""
        if name is None or not self.strict:
            return self.default
        for entry in self.entries:
            if name == entry.id or name in entry.aliases:
                return entry
        ids = ", ".join(e.id for e in self.entries)
        raise ApiError(
            "model_not_found",
            f"no model {name!r} here; GET /v1/models lists those served ({ids})",
            param="model",
        )


def load_registry(settings: Settings) -> Registry:
    """MODELS_FILE's models (RegistryError if it cannot be used), else MODEL_PATH's."""
    if settings.models_file is None:
        entry = ModelEntry(settings.served_model_name, settings, pinned=True)
        return Registry((entry,), strict=False)
    try:
        raw = tomllib.loads(settings.models_file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RegistryError(f"MODELS_FILE {settings.models_file} cannot be read: {exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RegistryError(f"MODELS_FILE is not TOML: {exc}") from None
    try:
        tables = ModelsFile.model_validate(raw).models
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RegistryError(f"MODELS_FILE: {where}: {first['msg']}") from None
    names: set[str] = set()
    for table in tables:
        for name in (table.id, *table.aliases):
            if name in names:
                raise RegistryError(f"MODELS_FILE names {name!r} twice (ids and aliases)")
            names.add(name)
    if not any(table.pinned for table in tables):
        raise RegistryError("MODELS_FILE pins no model: pin one (pinned = true), the default")
    several = len(tables) > 1
    return Registry(tuple(_entry(settings, table, several) for table in tables), strict=True)


def _entry(settings: Settings, table: ModelTable, several: bool) -> ModelEntry:
    spinning = table.thread_spinning
    update: dict[str, object] = {
        "thread_spinning": (settings.thread_spinning and not several)
        if spinning is None
        else spinning,
        "model_name": table.id,
        "kv_memory_mb": table.kv_memory_mb,
        "passage_kv_mb": table.passage_kv_mb,
        "models_file": None,
    }
    known = catalog.ENTRIES.get(table.path)
    if known is not None:  # a catalog name: its folder, downloaded there with MODEL_DOWNLOAD
        update |= {
            "model_path": Path("/home/models") / known.folder,
            "model_repo_id": known.repo_id,
            "model_subfolder": known.subfolder,
        }
    else:
        update["model_path"] = Path(table.path)
    if settings.prompt_cache_dir is not None:  # each model's files apart
        update["prompt_cache_dir"] = settings.prompt_cache_dir / table.id.replace("/", "_")
    return ModelEntry(
        table.id,
        settings.model_copy(update=update),
        tuple(table.aliases),
        table.pinned,
        table.system_prompt,
        table.temperature,
        table.idle_unload_s,
    )

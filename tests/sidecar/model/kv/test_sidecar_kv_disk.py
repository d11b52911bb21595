"""The disk tier's directory and files (model/kv/folder.py, model/kv/disk.py): it touches only
files it wrote (never through a link, only its own names, never a folder it does not own or
one of other files), and no file's content, a crafted one with this model's fingerprint
included, stops it from starting or makes a restore fail other than as a miss."""

from __future__ import annotations

import json
import logging
import os
import stat
import zlib
from pathlib import Path

import numpy as np
import pytest

from scripts.run import services
from sidecar.model.kv import disk as kv_disk
from sidecar.model.kv.compact import Block, CompactKv
from sidecar.model.kv.disk import DiskTier, Shape, Stored, Writing
from tests.sidecar.model.kv.test_sidecar_kv_tiers import chat_on_disk, make_engine
from tests.sidecar.support import predict

SHAPE = Shape(layers=1, kv_heads=2, head_size=4, encoding="int8")
FINGERPRINT = "f" * 64
REFUSED = "conversation cache disk tier refused its directory: RAM only"
IGNORED = "conversation cache file ignored"


def kv(tokens: int) -> CompactKv:
    def block() -> Block:
        data = np.ones((SHAPE.kv_heads, tokens, SHAPE.head_size), np.int8)
        return Block(data, np.ones((SHAPE.kv_heads, tokens), np.float32))

    return CompactKv("int8", tokens, [[block()] for _ in range(2 * SHAPE.layers)])


def whole(writing: Writing | None) -> Stored | None:
    """A file written at once (what a spill on a request's path does)."""
    return None if writing is None else writing.finish()


def tier(directory: Path) -> DiskTier:
    return DiskTier(directory, 2**20, FINGERPRINT, SHAPE)


def written(directory: Path, tokens: int = 3, scope: str = "s") -> Path:
    """A file the tier wrote (a conversation of `tokens` tokens), in a tier now gone."""
    stored = whole(tier(directory).begin(kv(tokens), list(range(tokens)), scope, False, tokens - 1))
    assert stored is not None
    return stored.path


def rewritten(path: Path, target: Path, **fields: object) -> Path:
    """`path`'s file with header fields changed (None: removed), its sizes and CRC made right
    again: what only someone who read a real file could craft."""
    data = path.read_bytes()
    _, _, length = kv_disk._HEAD.unpack_from(data)
    start = kv_disk._HEAD.size
    header = json.loads(data[start : start + length])
    raw = fields.pop("raw_header", None)
    header.update(fields)
    head = raw if isinstance(raw, bytes) else json.dumps(header).encode()
    body = kv_disk._HEAD.pack(kv_disk.MAGIC, kv_disk.VERSION, len(head)) + head
    body += data[start + length : -kv_disk._CRC.size]
    target.write_bytes(body + kv_disk._CRC.pack(zlib.crc32(body)))
    target.chmod(0o600)
    return target


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.message for r in caplog.records]


def test_a_link_at_the_setting_is_refused_and_its_target_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "precious"
    target.mkdir(mode=0o755)
    (target / "notes.txt").write_text("mine")
    (target / ("a" * 32 + ".kv")).write_bytes(b"not a cache file")  # even a name it owns
    link = tmp_path / "kv"
    link.symlink_to(target)
    before = contents(target)
    with caplog.at_level(logging.ERROR):
        disk = tier(link)
        assert disk.scan() == []
    assert not disk.enabled
    assert contents(target) == before
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert REFUSED in messages(caplog)
    assert disk.begin(kv(2), [1, 2], "s", False, 1) is None  # RAM only


def test_a_folder_of_other_files_is_not_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """PROMPT_CACHE_DIR pointed at the model's folder: nothing there is deleted or chmodded."""
    model = tmp_path / "model"
    model.mkdir(mode=0o755)
    (model / "model.onnx").write_bytes(b"weights")
    (model / "genai_config.json").write_text("{}")
    before = contents(model)
    with caplog.at_level(logging.ERROR):
        disk = tier(model)
        disk.scan()
    assert not disk.enabled and REFUSED in messages(caplog)
    assert contents(model) == before
    assert stat.S_IMODE(model.stat().st_mode) == 0o755


def test_a_folder_another_user_owns_is_not_taken_even_by_root(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    directory = tmp_path / "kv"
    directory.mkdir(mode=0o700)
    planted = directory / ("b" * 32 + ".kv")
    planted.write_bytes(b"theirs")
    os.chown(directory, 65534, 65534)
    os.chown(planted, 65534, 65534)
    with caplog.at_level(logging.ERROR):
        disk = tier(directory)
        disk.scan()
    assert not disk.enabled
    record = next(r for r in caplog.records if r.message == REFUSED)
    assert "owned by uid 65534" in record.fields["why"]  # type: ignore[attr-defined]
    assert planted.read_bytes() == b"theirs"


def test_a_new_or_empty_folder_is_made_private(tmp_path: Path) -> None:
    made = tier(tmp_path / "a" / "kv")
    assert made.enabled
    assert stat.S_IMODE((tmp_path / "a" / "kv").stat().st_mode) == 0o700
    empty = tmp_path / "volume"
    empty.mkdir(mode=0o777)
    assert tier(empty).enabled
    assert stat.S_IMODE(empty.stat().st_mode) == 0o700


def test_only_its_own_files_are_touched_and_links_inside_never_followed(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    kept = written(directory)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    own_name_link = directory / ("c" * 32 + ".kv")
    own_name_link.symlink_to(outside)
    (directory / ("d" * 32 + ".tmp")).symlink_to(tmp_path)
    (directory / "README").write_text("an operator's note")
    (directory / ("E" * 32 + ".kv")).write_bytes(b"not its name (upper case)")
    (directory / ("e" * 32 + ".tmp")).write_bytes(b"half written")  # its own: removed
    (directory / ("f" * 32 + ".del")).write_bytes(b"being deleted")  # its own: removed
    disk = tier(directory)
    assert [s.path for s in disk.scan()] == [kept]
    left = {p.name for p in directory.iterdir()}
    assert left == {kept.name, own_name_link.name, "d" * 32 + ".tmp", "README", "E" * 32 + ".kv"}
    assert outside.read_text() == "keep me"
    assert own_name_link.is_symlink()


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt_end": None},
        {"prompt_end": -1},
        {"prompt_end": 4},  # past its 3 tokens
        {"prompt_end": "1"},
        {"prompt_end": 1.5},
        {"sampling": "yes"},
        {"sampling": None},
        {"cache_scope": 5},
        {"cache_scope": ["s"]},
        {"cache_scope": "s" * 5000},
        {"tokens": "3"},
        {"tokens": True},
        {"tokens": -3},
        {"tokens": 2**40},
        {"tokens": None},
        {"raw_header": b"[1, 2, 3]"},
        {"raw_header": b"[" * 100000 + b"]" * 100000},  # deeper than json's recursion
        {"raw_header": b"\xff\xfe not utf-8"},
        {"raw_header": b'{"model": "' + b"f" * 64 + b'", "tokens": 1e999}'},
    ],
    ids=lambda fields: ",".join(fields),
)
def test_a_crafted_file_with_this_models_fingerprint_is_ignored_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fields: dict[str, object]
) -> None:
    directory = tmp_path / "kv"
    good = written(directory, scope="good")
    crafted = rewritten(good, directory / ("9" * 32 + ".kv"), **fields)
    with caplog.at_level(logging.WARNING):
        disk = tier(directory)
        found = disk.scan()
    assert [s.cache_scope for s in found] == ["good"]
    assert not crafted.exists()
    assert IGNORED in messages(caplog)


def test_a_file_changed_after_indexing_is_a_miss_at_restore(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Swapped, with a right CRC, for one whose header says other sizes, or for a link: the
    read is a miss (logged, the file deleted), never an exception."""
    directory = tmp_path / "kv"
    path = written(directory, tokens=4)
    disk = tier(directory)
    cases: list[dict[str, object]] = [
        {"tokens": 2},
        {"tokens": "4"},
        {"raw_header": b"{}"},
        {"raw_header": b"null"},
    ]
    for fields in cases:
        (stored,) = disk.scan()
        spare = rewritten(path, tmp_path / "spare", **fields)
        os.replace(spare, path)
        with caplog.at_level(logging.WARNING):
            assert disk.read(stored) is None
        assert not path.exists()
        path = written(directory, tokens=4)
        disk = tier(directory)
    (stored,) = disk.scan()
    path.unlink()
    path.symlink_to(written(tmp_path / "elsewhere", tokens=4))
    assert disk.read(stored) is None
    assert (tmp_path / "elsewhere").exists() and len(list((tmp_path / "elsewhere").iterdir()))


def test_the_sidecar_starts_and_serves_beside_a_crafted_file_for_its_model(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The probe's file: this model's fingerprint and `prompt_end: null`. It stopped the worker
    at every start (the sidecar never got ready); now it is ignored, deleted and logged."""
    directory = tmp_path / "kv"
    _, kept = chat_on_disk(tiny_model_dir, directory, "carol", 1)
    crafted = rewritten(kept, directory / ("7" * 32 + ".kv"), prompt_end=None)
    with services.sidecar(
        tiny_model_dir, tmp_path / "sidecar.log", PROMPT_CACHE_DIR=str(directory)
    ) as sidecar:
        response = predict(sidecar.url, {"messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 200
        log = sidecar.log()
    assert IGNORED in log and crafted.name in log
    # the conversation's file, and the passage store's own folder beside it (kv/passages.py)
    assert sorted(directory.iterdir()) == sorted([kept, directory / "passages"])


def test_the_start_line_says_the_tier_is_off_when_its_directory_is_refused(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "kv").symlink_to(target)
    with caplog.at_level(logging.INFO):
        make_engine(tiny_model_dir, prompt_cache_dir=tmp_path / "kv")
    (line,) = [r for r in caplog.records if r.message == "kv memory"]
    assert line.fields["disk_tier"] is None  # type: ignore[attr-defined]
    assert REFUSED in messages(caplog)


def test_blocks_are_handed_over_as_read_and_a_bad_crc_is_still_a_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`each` gets every tensor in order as it is read; the CRC is checked after the last, so
    a flipped byte there makes the read a miss although every block was handed over."""
    directory = tmp_path / "kv"
    path = written(directory, tokens=5)
    disk = tier(directory)
    (stored,) = disk.scan()
    handed: list[int] = []
    kv = disk.read(stored, lambda index, block: handed.append(index))
    assert kv is not None and handed == list(range(2 * SHAPE.layers))
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # the last scale's last byte, just before the CRC
    path.write_bytes(bytes(data))
    handed.clear()
    with caplog.at_level(logging.WARNING):
        assert disk.read(stored, lambda index, block: handed.append(index)) is None
    assert handed == list(range(2 * SHAPE.layers))
    assert [r.fields["why"] for r in caplog.records] == ["truncated or corrupt (CRC)"]  # type: ignore[attr-defined]
    assert not path.exists()


def random_kv(tokens: int, runs: int, seed: int) -> CompactKv:
    rng = np.random.default_rng(seed)

    def run() -> Block:
        shape = (SHAPE.kv_heads, tokens // runs, SHAPE.head_size)
        data = rng.integers(-127, 128, shape, dtype=np.int8)
        return Block(data, rng.random((SHAPE.kv_heads, tokens // runs), np.float32))

    blocks = [[run() for _ in range(runs)] for _ in range(2 * SHAPE.layers)]
    return CompactKv("int8", tokens, blocks)


def test_a_file_written_a_piece_at_a_time_is_the_file_written_whole(tmp_path: Path) -> None:
    """kv.disk.Writing, as idle work drives it: a tensor a step, of a snapshot taken at the
    start (the copy growing meanwhile changes nothing), the same bytes as one write."""
    kv = random_kv(6, runs=3, seed=1)
    at_once = whole(tier(tmp_path / "whole").begin(kv, list(range(6)), "s", False, 5))
    assert at_once is not None
    disk = tier(tmp_path / "pieces")
    writing = disk.begin(kv, list(range(6)), "s", False, 5)
    assert writing is not None
    steps = 0
    while not writing.step(1):
        steps += 1
        if steps == 2:
            kv.extend(random_kv(2, runs=1, seed=2))  # the conversation went on meanwhile
    assert steps >= 2 * SHAPE.layers * 2  # values and scales of every tensor, a step each
    assert disk.files == {} and [p.suffix for p in (tmp_path / "pieces").iterdir()] == [".tmp"]
    stored = writing.finish()
    assert stored is not None and disk.files == {stored.path: stored}
    assert stored.path.read_bytes() == at_once.path.read_bytes()
    assert stored.nbytes == at_once.nbytes


def test_an_abandoned_write_leaves_no_file(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    disk = tier(directory)
    writing = disk.begin(kv(4), list(range(4)), "s", False, 3)
    assert writing is not None
    writing.step(1)
    writing.abandon()
    assert list(directory.iterdir()) == [] and disk.files == {}
    assert writing.finish() is None and disk.enabled  # dropped, not failed


def test_a_forgotten_file_leaves_the_tier_at_once_and_the_disk_off_the_callers_path(
    tmp_path: Path,
) -> None:
    """Deleted by a thread of its own (kv.folder.Folder.discard): its name is gone at once, so
    no scan (a restart) can take it back, and the file itself soon after."""
    directory = tmp_path / "kv"
    disk = tier(directory)
    stored = whole(disk.begin(kv(4), list(range(4)), "s", False, 3))
    assert stored is not None
    replacing = whole(disk.begin(kv(5), list(range(5)), "s", False, 4, replaces=stored))
    assert replacing is not None
    assert not stored.path.exists() and set(disk.files) == {replacing.path}
    assert [s.path for s in tier(directory).scan()] == [replacing.path]
    assert disk.folder is not None
    disk.folder.settle()
    assert [p.name for p in directory.iterdir()] == [replacing.path.name]

"""The browser libraries under static/vendor/ are exactly the pinned npm files, with licences,
and the page's scripts import nothing from anywhere else."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from scripts import vendor_static

STATIC = Path(vendor_static.VENDOR).parent


def test_vendored_files_match_the_manifest() -> None:
    assert vendor_static.check() == []


def test_every_package_is_pinned_with_its_licence() -> None:
    for package in vendor_static.load_manifest()["packages"]:
        assert re.fullmatch(r"\d+\.\d+\.\d+", package["version"]), package
        assert package["integrity"].startswith("sha512-"), package
        assert package["license"]
        paths = [entry["path"] for entry in package["files"]]
        assert any(Path(path).name.startswith("LICENSE") for path in paths), package["name"]


def test_a_changed_file_is_noticed(tmp_path: Path) -> None:
    copy = tmp_path / "vendor"
    shutil.copytree(vendor_static.VENDOR, copy)
    (copy / "marked" / "marked.esm.js").write_text("alert(1)")
    (copy / "marked" / "extra.js").write_text("")
    assert vendor_static.check(copy) == [
        "marked/marked.esm.js (marked) differs from the manifest",
        "marked/extra.js is not in the manifest",
    ]


def test_scripts_import_only_local_files() -> None:
    vendored = {
        entry["path"] for p in vendor_static.load_manifest()["packages"] for entry in p["files"]
    }
    for script in STATIC.glob("*.js"):
        source = script.read_text(encoding="utf-8")
        for target in re.findall(r"""^\s*import\b[^'"]*['"]([^'"]+)['"]""", source, re.M):
            assert target.startswith("./"), f"{script.name} imports {target}"
            path = target[2:]
            assert (STATIC / path).is_file(), f"{script.name} imports a missing {target}"
            if path.startswith("vendor/"):
                assert path.removeprefix("vendor/") in vendored

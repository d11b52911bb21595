"""Check or refresh the browser libraries vendored under main-app/chatapp/static/vendor/.

The chat page loads nothing from a CDN (a site may be disconnected, and its Content-Security-
Policy allows only the app's own files). Its libraries are copied from their npm packages at
exact versions, the built browser file and the licences only:

- marked (Markdown to HTML), MIT;
- DOMPurify (the allow-list sanitiser every rendered reply goes through), Apache-2.0 or MPL-2.0;
- highlight.js, the common-languages ES module build from @highlightjs/cdn-assets (class-based
  code colours; the page's own stylesheet holds the theme), BSD-3-Clause.

`static/vendor/manifest.json` pins each package (name, version, the npm tarball's integrity) and
every copied file (its path in the package, its path here, its sha256).

    python -m scripts.vendor_static                      # check the files (no network)
    python -m scripts.vendor_static --update             # fetch the pinned versions again
    python -m scripts.vendor_static --update --set marked=18.3.0   # move a package

`--update` downloads each package with `npm pack NAME@VERSION` (npm's own registry settings
apply), refuses a tarball whose integrity differs from the manifest's for an unchanged version,
copies the listed files and rewrites the manifest. A test runs the check.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VENDOR = REPO / "main-app" / "chatapp" / "static" / "vendor"
MANIFEST = VENDOR / "manifest.json"
# Files in VENDOR that are not copies of a package's files.
OWN_FILES = {"manifest.json", "README.md"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return manifest


def check(vendor: Path = VENDOR) -> list[str]:
    """Problems with the vendored files (missing, changed, unlisted); empty when all match."""
    problems = []
    listed = set()
    for package in load_manifest(vendor / "manifest.json")["packages"]:
        for entry in package["files"]:
            listed.add(entry["path"])
            path = vendor / entry["path"]
            if not path.is_file():
                problems.append(f"{entry['path']} ({package['name']}) is missing")
            elif sha256(path) != entry["sha256"]:
                problems.append(f"{entry['path']} ({package['name']}) differs from the manifest")
    for path in sorted(vendor.rglob("*")):
        name = path.relative_to(vendor).as_posix()
        if path.is_file() and name not in listed and name not in OWN_FILES:
            problems.append(f"{name} is not in the manifest")
    return problems


def _integrity(data: bytes, algorithm: str) -> str:
    digest = hashlib.new(algorithm, data).digest()
    return f"{algorithm}-{base64.b64encode(digest).decode()}"


def _npm_pack(spec: str, into: Path) -> tuple[Path, str]:
    """Download one package tarball with npm; returns its path and npm's integrity string."""
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("npm is not installed; --update needs it (apt-get install npm)")
    result = subprocess.run(
        [npm, "pack", spec, "--json", "--pack-destination", str(into)],
        check=True,
        capture_output=True,
        text=True,
    )
    info = json.loads(result.stdout)[0]
    return into / info["filename"], info["integrity"]


def update(pins: dict[str, str], vendor: Path = VENDOR) -> None:
    manifest = load_manifest(vendor / "manifest.json")
    with tempfile.TemporaryDirectory() as tmp:
        for package in manifest["packages"]:
            name = package["name"]
            version = pins.pop(name, package["version"])
            tarball, integrity = _npm_pack(f"{name}@{version}", Path(tmp))
            algorithm = integrity.split("-", 1)[0]
            if _integrity(tarball.read_bytes(), algorithm) != integrity:
                raise SystemExit(f"{name}@{version}: the tarball does not match npm's integrity")
            pinned = package.get("integrity")
            if version == package["version"] and pinned and integrity != pinned:
                raise SystemExit(
                    f"{name}@{version}: the registry's tarball is not the one pinned "
                    f"({integrity} instead of {pinned}); refusing it"
                )
            with tarfile.open(tarball) as archive:
                for entry in package["files"]:
                    member = archive.extractfile(f"package/{entry['source']}")
                    if member is None:
                        raise SystemExit(f"{name}@{version} has no file {entry['source']}")
                    target = vendor / entry["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(member.read())
                    entry["sha256"] = sha256(target)
            package["version"], package["integrity"] = version, integrity
            print(f"{name}@{version}: {len(package['files'])} files")
    if pins:
        raise SystemExit(f"not in the manifest: {', '.join(sorted(pins))}")
    text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    (vendor / "manifest.json").write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--update", action="store_true", help="download the pinned packages with npm and copy"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VERSION",
        help="with --update: pin a package to another exact version",
    )
    args = parser.parse_args(argv)
    if args.set and not args.update:
        parser.error("--set needs --update")
    pins = dict(pin.split("=", 1) for pin in args.set)
    if args.update:
        update(pins)
    problems = check()
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"vendored files match {MANIFEST.relative_to(REPO)}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

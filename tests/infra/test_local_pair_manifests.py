"""infra/docker-compose*.yml and infra/k8s/, read as YAML: the pair shares one network
namespace, only the app's port is published, probes are there, ports match the code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from chatapp.settings import DEFAULTS as APP_DEFAULTS
from chatapp.settings import listen_address
from scripts.run import services
from sidecar.settings import Settings

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
APP_PORT = listen_address({})[1]
SIDECAR_PORT = Settings.model_fields["port"].default
SIDECAR_URL = APP_DEFAULTS["SIDECAR_URL"]
FIELDS = set(Settings.model_fields)


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def stages(dockerfile: Path) -> set[str]:
    return set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile.read_text(), re.MULTILINE))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = load(INFRA / "docker-compose.yml")
    return data


def test_code_defaults_are_what_the_manifests_assume() -> None:
    assert (APP_PORT, SIDECAR_PORT) == (8080, 8000)
    assert f"http://localhost:{SIDECAR_PORT}" == SIDECAR_URL


def test_compose_app_shares_the_sidecars_network_namespace(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"sidecar", "app"}
    app = services["app"]
    assert app["network_mode"] == "service:sidecar"
    assert app["environment"]["SIDECAR_URL"] == SIDECAR_URL
    assert str(app["environment"]["PORT"]) == str(APP_PORT)


def test_compose_publishes_only_the_apps_port_on_the_namespace_owner(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    assert "ports" not in services["app"]  # Compose refuses ports with network_mode: service
    (published,) = services["sidecar"]["ports"]
    assert str(published).rsplit(":", 1)[-1] == str(APP_PORT)
    assert str(SIDECAR_PORT) not in str(published)


def test_compose_app_waits_for_the_sidecars_readiness(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["app"]["depends_on"]["sidecar"]["condition"] == "service_healthy"
    check = " ".join(services["sidecar"]["healthcheck"]["test"])
    assert f"127.0.0.1:{SIDECAR_PORT}/readyz" in check


def test_compose_app_measures_passages_with_the_sidecars_own_encoder_tokenizer(
    compose: dict[str, Any],
) -> None:
    """The sidecar downloads a catalog encoder into its models volume; the app mounts that same
    volume read-only at the same path and names the encoder's folder in EMBED_TOKENIZER, so its
    passages are cut by the very tokenizer.json the sidecar encodes with (without it they come
    out a quarter of the encoder's limit). The app starts once the encoder has settled."""
    from chatapp.settings import from_environ

    sidecar, app = compose["services"]["sidecar"], compose["services"]["app"]
    sidecar_settings = Settings(
        **{k.lower(): v for k, v in sidecar["environment"].items() if k.lower() in FIELDS}
    )
    assert sidecar_settings.embed_model_id and sidecar_settings.model_download
    folder = sidecar_settings.embed_model_path
    assert folder is not None
    tokenizer = from_environ({k: str(v) for k, v in app["environment"].items()})["EMBED_TOKENIZER"]
    assert Path(tokenizer) == folder
    mounts = {m.split(":")[1]: m.split(":") for m in sidecar["volumes"]}
    app_mounts = {m.split(":")[1]: m.split(":") for m in app["volumes"]}
    (where,) = [path for path in mounts if folder.is_relative_to(path)]
    volume = mounts[where][0]
    assert app_mounts[where][0] == volume and app_mounts[where][2:] == ["ro"]
    assert volume in compose["volumes"]
    check = " ".join(sidecar["healthcheck"]["test"][3:])
    compile(check, "healthcheck", "exec")
    assert "SystemExit(r['embeddings']['phase'] not in ('off', 'ready', 'failed'))" in check


def test_compose_sidecar_healthcheck_passes_once_the_encoder_is_ready(
    compose: dict[str, Any], encoder_sidecar: services.Service
) -> None:
    """The healthcheck's own command, pointed at a real sidecar with its encoder ready: it
    passes; at a port where nothing answers: it fails."""
    import subprocess
    import sys

    check = compose["services"]["sidecar"]["healthcheck"]["test"][3]
    ours = f"http://127.0.0.1:{SIDECAR_PORT}"
    assert ours in check
    for url, status in ((encoder_sidecar.url, 0), (f"http://127.0.0.1:{services.free_port()}", 1)):
        command = [sys.executable, "-c", check.replace(ours, url)]
        assert subprocess.run(command, capture_output=True, timeout=30).returncode == status, url


def test_compose_builds_the_real_dockerfiles(compose: dict[str, Any]) -> None:
    baked = load(INFRA / "docker-compose.baked.yml")["services"]["sidecar"]
    for service, build in (
        ("sidecar", compose["services"]["sidecar"]["build"]),
        ("app", compose["services"]["app"]["build"]),
    ):
        context = (INFRA / build["context"]).resolve()
        assert (context / "Dockerfile").is_file(), service
    sidecar_stages = stages(REPO / "phi3-sidecar" / "Dockerfile")
    assert compose["services"]["sidecar"]["build"]["target"] in sidecar_stages
    assert baked["build"]["target"] in sidecar_stages
    assert "model" in baked["build"]["additional_contexts"]
    # The downloaded model lands in the volume mounted where the image looks for it.
    volume = compose["services"]["sidecar"]["volumes"][0]
    assert str(Settings.model_fields["model_path"].default).startswith(volume.split(":")[1])


@pytest.fixture(scope="module")
def k8s() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((INFRA / "k8s" / "phi3-chat.yaml").read_text())]


def kind(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == name]
    return doc


def test_k8s_pod_holds_both_containers_with_probes(k8s: list[dict[str, Any]]) -> None:
    deployment = kind(k8s, "Deployment")
    assert deployment["spec"]["replicas"] >= 2  # the pair scales as a unit
    pod = deployment["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"app", "sidecar"}
    for container in containers.values():
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert "readinessProbe" in container
    sidecar, app = containers["sidecar"], containers["app"]
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": SIDECAR_PORT}
    # The app's /readyz: ready only when a chat can be served (its /healthz is 200 whatever the
    # sidecar does, and the sidecar's own open /readyz cannot see that it refuses the app's key).
    assert app["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": APP_PORT}
    assert sidecar["livenessProbe"]["httpGet"]["port"] == SIDECAR_PORT
    assert app["livenessProbe"]["httpGet"]["port"] == APP_PORT
    assert [p["containerPort"] for p in app["ports"]] == [APP_PORT]
    assert [p["containerPort"] for p in sidecar["ports"]] == [SIDECAR_PORT]
    env = {e["name"]: e.get("value") for e in app["env"]}
    assert env["SIDECAR_URL"] == SIDECAR_URL


def test_k8s_replicas_share_one_database_and_scale(k8s: list[dict[str, Any]]) -> None:
    pod = kind(k8s, "Deployment")["spec"]["template"]["spec"]
    app = next(c for c in pod["containers"] if c["name"] == "app")
    database = next(e for e in app["env"] if e["name"] == "DATABASE_URL")
    assert database["valueFrom"]["secretKeyRef"] == {
        "name": "phi3-chat-database",
        "key": "url",
        "optional": True,
    }
    assert kind(k8s, "Service")["spec"]["sessionAffinity"] == "ClientIP"
    hpa = kind(k8s, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == kind(k8s, "Deployment")["metadata"]["name"]
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]


def test_k8s_runs_as_the_images_non_root_user(k8s: list[dict[str, Any]]) -> None:
    pod = kind(k8s, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    uid = pod["securityContext"]["runAsUser"]
    for service in ("phi3-sidecar", "main-app"):
        assert f"USER {uid}:{uid}" in (REPO / service / "Dockerfile").read_text()
    for container in pod["containers"]:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_k8s_exposes_only_the_apps_port(k8s: list[dict[str, Any]]) -> None:
    pod = kind(k8s, "Deployment")["spec"]["template"]["spec"]
    named = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c["ports"]}
    service = kind(k8s, "Service")
    targets = [p["targetPort"] for p in service["spec"]["ports"]]
    assert [named.get(t, t) for t in targets] == [APP_PORT]
    policy = kind(k8s, "NetworkPolicy")
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert ports == [APP_PORT]
    selector = kind(k8s, "Deployment")["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector == policy["spec"]["podSelector"]["matchLabels"]


def test_kustomization_names_the_manifest_and_both_images(k8s: list[dict[str, Any]]) -> None:
    kustomization = load(INFRA / "k8s" / "kustomization.yaml")
    assert kustomization["resources"] == ["phi3-chat.yaml"]
    pod = kind(k8s, "Deployment")["spec"]["template"]["spec"]
    images = {c["image"].split(":")[0] for c in pod["containers"]}
    assert {i["name"] for i in kustomization["images"]} == images


def test_compose_gpu_override_reserves_a_gpu_for_the_cuda_target() -> None:
    gpu = load(INFRA / "docker-compose.gpu.yml")["services"]["sidecar"]
    assert gpu["build"]["target"] == "cuda" in stages(REPO / "phi3-sidecar" / "Dockerfile")
    assert gpu["environment"]["MODEL_DEVICE"] == "cuda"
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert_cuda_model(gpu["environment"])


def assert_cuda_model(env: dict[str, str]) -> None:
    """MODEL_ID is a catalog entry built for cuda, and MODEL_PATH its folder."""
    from sidecar import catalog

    entry = catalog.ENTRIES[env["MODEL_ID"]]
    assert entry.device == "cuda"
    assert env["MODEL_PATH"] == f"/home/models/{entry.folder}"
    assert env["MODEL_DOWNLOAD"] == "1"


def test_k8s_gpu_overlay_gives_the_sidecar_one_gpu() -> None:
    overlay = load(INFRA / "k8s-gpu" / "kustomization.yaml")
    assert overlay["resources"] == ["../k8s"]
    (patch_file,) = [p["path"] for p in overlay["patches"]]
    patch = load(INFRA / "k8s-gpu" / patch_file)
    base = next(d for d in yaml.safe_load_all((INFRA / "k8s" / "phi3-chat.yaml").read_text()))
    assert (patch["kind"], patch["metadata"]["name"]) == (base["kind"], base["metadata"]["name"])
    (sidecar,) = patch["spec"]["template"]["spec"]["containers"]
    assert sidecar["name"] == "sidecar"
    assert sidecar["resources"]["limits"]["nvidia.com/gpu"] == 1
    env = {e["name"]: e["value"] for e in sidecar["env"]}
    assert env["MODEL_DEVICE"] == "cuda"
    assert_cuda_model(env)
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    volumes = {v["name"] for v in patch["spec"]["template"]["spec"]["volumes"]}
    assert mounts == {"models": "/home/models"} and set(mounts) <= volumes
    tolerated = {t["key"] for t in patch["spec"]["template"]["spec"]["tolerations"]}
    assert "nvidia.com/gpu" in tolerated


def test_k8s_gpu_overlay_renders_with_kustomize() -> None:
    """kubectl's own kustomize builds the overlay (skipped where kubectl is not installed)."""
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(INFRA / "k8s-gpu")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    deployment = next(d for d in yaml.safe_load_all(rendered) if d["kind"] == "Deployment")
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert containers["sidecar"]["image"] == "phi3-chat/sidecar:latest-cuda"
    assert containers["sidecar"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert containers["app"]["image"] == "phi3-chat/app:latest"  # the rest is infra/k8s
    assert {"PORT", "MODEL_DEVICE"} <= {e["name"] for e in containers["sidecar"]["env"]}


class _Reset:
    """Compose's `!reset`: the key is removed from the merged file."""


class _Override:
    """Compose's `!override`: the value replaces the base's instead of merging with it."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _ComposeLoader(yaml.SafeLoader):
    pass


_ComposeLoader.add_constructor("!reset", lambda loader, node: _Reset())
_ComposeLoader.add_constructor(
    "!override",
    lambda loader, node: _Override(
        loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.MappingNode)
        else loader.construct_sequence(node, deep=True)  # type: ignore[arg-type]
    ),
)


def compose_merge(base: Any, override: Any) -> Any:
    """Compose's merge rules, as far as these files use them: mappings merge key by key,
    sequences append, `!reset` removes and `!override` replaces."""
    if isinstance(override, _Override):
        return override.value
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if isinstance(value, _Reset):
                merged.pop(key, None)
            elif key in merged and key not in ("command", "entrypoint", "test"):
                merged[key] = compose_merge(merged[key], value)
            else:
                merged[key] = value.value if isinstance(value, _Override) else value
        return merged
    if isinstance(base, list) and isinstance(override, list):
        return base + override
    return override


def substitute(value: str) -> str:
    """${NAME:-default} with NAME unset, as Compose interpolates it."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_compose_ollama_override_puts_the_app_in_front_of_ollama(compose: dict[str, Any]) -> None:
    from chatapp.settings import from_environ

    override = yaml.load((INFRA / "docker-compose.ollama.yml").read_text(), _ComposeLoader)
    services = compose_merge(compose, override)["services"]
    ollama, pull, app = services["sidecar"], services["ollama-pull"], services["app"]
    # Ollama's pinned image replaces our build, with none of our sidecar's settings left.
    assert "build" not in ollama and re.fullmatch(r"\S+/ollama:\d+\.\d+\.\d+", ollama["image"])
    assert "MODEL_DOWNLOAD" not in ollama["environment"]
    assert ollama["volumes"] == ["ollama:/root/.ollama"]
    assert ollama["ports"] == compose["services"]["sidecar"]["ports"]  # only the app's port
    port = ollama["environment"]["OLLAMA_HOST"].rsplit(":", 1)[1]
    # The app speaks OpenAI to it, inside the shared namespace, for the model that was pulled.
    settings = from_environ({k: substitute(str(v)) for k, v in app["environment"].items()})
    assert settings["UPSTREAM_API"] == "openai"
    assert settings["SIDECAR_URL"] == f"http://localhost:{port}"
    assert pull["network_mode"] == app["network_mode"] == "service:sidecar"
    assert pull["image"] == ollama["image"]
    assert [substitute(part) for part in pull["command"]] == ["pull", settings["UPSTREAM_MODEL"]]
    assert pull["depends_on"]["sidecar"]["condition"] == "service_healthy"
    assert app["depends_on"]["ollama-pull"]["condition"] == "service_completed_successfully"
    assert "ollama" in compose_merge(compose, override)["volumes"]
    # Ollama's encoder is not our sidecar's: the app mounts no models and counts by the bound.
    assert settings.get("EMBED_TOKENIZER") is None
    assert app["volumes"] == ["app-data:/data"]

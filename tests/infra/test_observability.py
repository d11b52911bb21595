"""infra/docker-compose.observability.yml and infra/observability/, read as YAML and JSON (no
Docker engine here): the override joins the pair without changing its network, its images are
pinned, every mounted file exists, the pieces point at each other's ports, and every metric the
Grafana dashboard queries is one the services really expose."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from chatapp import create_app
from chatapp.settings import listen_address
from scripts.run.services import Service
from sidecar.settings import Settings

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
OBSERVABILITY = INFRA / "observability"
DASHBOARD = OBSERVABILITY / "grafana" / "dashboards" / "phi3-chat.json"
APP_PORT = listen_address({})[1]
SIDECAR_PORT = Settings.model_fields["port"].default
EXTRA = {"otel-collector", "tempo", "prometheus", "grafana"}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def override() -> dict[str, Any]:
    data: dict[str, Any] = load(INFRA / "docker-compose.observability.yml")
    return data


def test_the_override_adds_the_watchers_and_leaves_the_pairs_network_alone(
    override: dict[str, Any],
) -> None:
    services = override["services"]
    base = load(INFRA / "docker-compose.yml")["services"]
    assert set(services) == set(base) | EXTRA
    for name in base:  # only environment is added to the pair
        assert set(services[name]) == {"environment"}, name
        assert services[name]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == (
            "http://otel-collector:4318"
        )
    for name in EXTRA:
        image = services[name]["image"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), image  # a pinned release
        for port in services[name].get("ports", []):
            assert str(port).startswith("127.0.0.1:"), port  # never on every interface
        for volume in services[name].get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (INFRA / source).exists(), volume
    assert set(override["volumes"]) == {"tempo", "prometheus"}


def test_prometheus_scrapes_both_services_where_they_listen() -> None:
    jobs = load(OBSERVABILITY / "prometheus.yml")["scrape_configs"]
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in jobs}
    # The app shares the sidecar's network namespace, hence the sidecar's host name.
    assert targets == {
        "phi3-sidecar": [f"sidecar:{SIDECAR_PORT}"],
        "phi3-chat-app": [f"sidecar:{APP_PORT}"],
    }


def test_the_collector_takes_otlp_http_and_hands_traces_to_tempo() -> None:
    collector = load(OBSERVABILITY / "otel-collector.yaml")
    assert collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"
    (pipeline,) = collector["service"]["pipelines"].values()
    for kind in ("receivers", "processors", "exporters"):
        assert set(pipeline[kind]) <= set(collector[kind]), kind
    (exporter,) = pipeline["exporters"]
    tempo = load(OBSERVABILITY / "tempo.yaml")
    grpc = tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert collector["exporters"][exporter]["endpoint"] == "tempo:" + grpc.rsplit(":", 1)[1]
    replay = load(OBSERVABILITY / "otel-collector-replay.yaml")
    (pipeline,) = replay["service"]["pipelines"].values()
    assert pipeline["receivers"] == ["otlpjsonfile"]


def test_grafana_provisions_the_dashboard_and_its_data_sources(override: dict[str, Any]) -> None:
    grafana = override["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    (provider,) = load(
        OBSERVABILITY / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml"
    )["providers"]
    dashboards = provider["options"]["path"]
    assert (INFRA / {v: k for k, v in mounts.items()}[dashboards]).resolve() == DASHBOARD.parent
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dashboards}/{DASHBOARD.name}"
    sources = load(OBSERVABILITY / "grafana" / "provisioning" / "datasources" / "datasources.yaml")[
        "datasources"
    ]
    uids = {source["uid"] for source in sources}
    dashboard = json.loads(DASHBOARD.read_text())
    used = {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p}
    assert used == uids == {"prometheus", "tempo"}


def panels_without_rows() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def test_dashboard_panels_do_not_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        pos = panel["gridPos"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, panel["title"]
        assert pos["x"] + pos["w"] <= 24
        taken |= cells


def exposed_types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\w+) (\w+)$", text, re.M))


def test_every_metric_the_dashboard_queries_is_exposed(sidecar_service: Service) -> None:
    types = exposed_types(httpx.get(sidecar_service.url + "/metrics", timeout=10).text)
    app_metrics = create_app({"TESTING": True}).test_client().get("/metrics").text
    types |= exposed_types(app_metrics)
    queried = set()
    for panel in panels_without_rows():
        for target in panel["targets"]:
            queried |= set(re.findall(r"\b((?:sidecar|chatapp)_\w+)", target.get("expr", "")))
    assert len(queried) > 15
    for name in queried:
        base, _, suffix = name.rpartition("_")
        if suffix in ("bucket", "sum", "count") and types.get(base) == "histogram":
            continue
        assert name in types, name
    histograms = {n for n, kind in types.items() if kind == "histogram"}
    watched = {n.rsplit("_", 1)[0] for n in queried if n.endswith("_bucket")}
    assert histograms == watched  # every histogram has a panel

"""infra/main.bicep read as text (the Bicep compiler cannot be installed here): one main
container, the ports the code listens on, the settings the code reads, pulls by managed
identity, and the parameters file and azure.yaml that drive it."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from chatapp.settings import DEFAULTS as APP_DEFAULTS
from chatapp.settings import SettingsError, from_environ, listen_address
from sidecar.settings import Settings

REPO = Path(__file__).resolve().parents[2]
BICEP = REPO / "infra" / "main.bicep"
ACR_PULL = "7f951dda-4ed3-4680-a7ca-43fe172d538d"
SIDECAR_VARIABLES = {name.upper() for name in Settings.model_fields}


def app_reads(variable: str) -> bool:
    """Whether the chat app reads this environment variable (through its public settings)."""
    if variable in ("HOST", "PORT"):  # read by chatapp.gunicorn_conf through listen_address
        return True
    try:
        return any(from_environ({variable: sample}) for sample in ("http://localhost:1", "1"))
    except SettingsError:  # read, and this sample is not a value it takes
        return True


def strip_comments(text: str) -> str:
    """Drop // and /* */ comments outside strings; keep line structure."""
    out, i, in_string = [], 0, False
    while i < len(text):
        ch = text[i]
        if in_string:
            out.append(ch)
            if ch == "\\":
                out.append(text[i + 1])
                i += 1
            elif ch == "'":
                in_string = False
        elif ch == "'":
            in_string = True
            out.append(ch)
        elif text.startswith("//", i):
            i = text.find("\n", i) - 1 if "\n" in text[i:] else len(text)
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 1
        else:
            out.append(ch)
        i += 1
    return "".join(out)


SOURCE = strip_comments(BICEP.read_text())


def block(text: str, start: int) -> str:
    """The text from the brace or bracket at `start` to its match (strings skipped)."""
    pairs = {"{": "}", "[": "]", "(": ")"}
    stack, in_string = [], False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            in_string = ch != "'"
        elif ch == "'":
            in_string = True
        elif ch in pairs:
            stack.append(pairs[ch])
        elif ch in pairs.values():
            assert stack and stack.pop() == ch, f"unbalanced {ch!r} at {i}"
            if not stack:
                return text[start : i + 1]
    raise AssertionError(f"unclosed block at {start}")


def resources() -> list[dict[str, str]]:
    found = []
    pattern = r"^resource (\w+) '([\w./]+)@([\d-]+(?:-preview)?)' = (?:if \(\w+\) )?"
    for match in re.finditer(pattern, SOURCE, re.M):
        found.append(
            {
                "symbol": match[1],
                "type": match[2],
                "api": match[3],
                "body": block(SOURCE, match.end()),
            }
        )
    return found


def of_type(resource_type: str) -> list[dict[str, str]]:
    return [r for r in resources() if r["type"] == resource_type]


def value(body: str, key: str) -> str:
    """The raw value of the first `key: value` line in body."""
    match = re.search(rf"^\s*{key}: (.+)$", body, re.M)
    assert match, f"{key} not found"
    return match[1].strip()


def variables() -> dict[str, str]:
    return dict(re.findall(r"^var (\w+) = '([^']*)'$", SOURCE, re.M))


def string_params() -> dict[str, str]:
    """The string parameters' default values."""
    return dict(re.findall(r"^param (\w+) string = '([^']*)'$", SOURCE, re.M))


def resolve(raw: str) -> str:
    """A string literal, or a simple string variable's value or string parameter's default;
    '${name}' is interpolated."""
    names = string_params() | variables()
    if raw in names:
        return names[raw]
    assert raw.startswith("'") and raw.endswith("'"), raw
    return re.sub(r"\$\{(\w+)\}", lambda m: names[m[1]], raw[1:-1])


def name_value_pairs(text: str) -> list[tuple[str, str]]:
    return re.findall(r"\{ name: '([^']+)', value: ('(?:[^'\\]|\\.)*'|[\w.]+) \}", text)


def app_settings() -> dict[str, str]:
    start = SOURCE.index("var appSettings = ")
    settings = dict(name_value_pairs(block(SOURCE, SOURCE.index("(", start))))
    for listed in ("downloadSettings", "appEncoderSettings", "kvCacheSettings"):  # in appSettings
        start = SOURCE.index(f"var {listed} = ")
        settings.update(name_value_pairs(block(SOURCE, SOURCE.index("[", start))))
    return settings


def params() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for match in re.finditer(r"^param (\w+) (\w+)(?: = (.+))?$", SOURCE, re.M):
        found[match[1]] = match[3]
    return found


def containers() -> dict[str, dict[str, str]]:
    return {
        resolve(value(r["body"], "name")): r for r in of_type("Microsoft.Web/sites/sitecontainers")
    }


def test_brackets_balance() -> None:
    block("{" + SOURCE + "}", 0)


def test_exactly_one_main_container_and_one_sidecar() -> None:
    found = containers()
    assert len(found) == 2
    mains = [name for name, r in found.items() if value(r["body"], "isMain") == "true"]
    assert mains == ["main"]
    assert value(found["phi3"]["body"], "isMain") == "false"


def test_sitecontainers_api_is_2024_04_01_or_newer() -> None:
    for resource in of_type("Microsoft.Web/sites/sitecontainers"):
        assert resource["api"] >= "2024-04-01"
        assert value(resource["body"], "parent") == "site"


def test_container_ports_are_the_ones_the_code_listens_on() -> None:
    found = containers()
    assert resolve(value(found["main"]["body"], "targetPort")) == str(listen_address({})[1])
    sidecar_port = str(Settings.model_fields["port"].default)
    assert resolve(value(found["phi3"]["body"], "targetPort")) == sidecar_port
    settings = app_settings()
    assert resolve(settings["SIDECAR_URL"]) == APP_DEFAULTS["SIDECAR_URL"]


def test_one_parameter_moves_the_sidecar_to_the_extensions_port() -> None:
    """sidecarPort: the sidecar's PORT and targetPort and the app's SIDECAR_URL follow it, and
    11434 (App Service's built-in model sidecar extension) is one of its values."""
    assert params()["sidecarPort"] == "'8000'"
    allowed = block(
        SOURCE, SOURCE.index("[", SOURCE.rindex("@allowed([", 0, SOURCE.index("param sidecarPort")))
    )
    assert re.findall(r"'(\d+)'", allowed) == ["8000", "11434"]
    found = containers()
    assert value(found["phi3"]["body"], "targetPort") == "sidecarPort"
    settings = app_settings()
    assert settings["SIDECAR_URL"] == "'http://localhost:${sidecarPort}'"
    assert settings["SIDECAR_PORT"] == "sidecarPort"
    body = found["phi3"]["body"]
    pairs = name_value_pairs(block(body, body.index("environmentVariables: ") + 22))
    assert ("PORT", "'SIDECAR_PORT'") in pairs
    given = json.loads((REPO / "infra" / "main.parameters.json").read_text())["parameters"]
    assert given["sidecarPort"]["value"] == "${SIDECAR_PORT=8000}"


def test_container_variables_are_settings_the_code_reads_and_the_app_defines() -> None:
    settings = app_settings()
    found = containers()
    readers = (("main", app_reads), ("phi3", SIDECAR_VARIABLES.__contains__))
    for container, reads in readers:
        body = found[container]["body"]
        assert value(body, "inheritAppSettingsAndConnectionStrings") == "false"
        pairs = name_value_pairs(block(body, body.index("environmentVariables: ") + 22))
        for variable, setting in pairs:
            assert reads(variable), (container, variable)
            # The value of a sitecontainer variable is the NAME of an app setting.
            assert resolve(setting) in settings, (container, setting)
    # The sidecar's model variables come from downloadSettings, one for one, by name.
    assert "sidecarModelVariables" in found["phi3"]["body"]
    assert "name: setting.name" in SOURCE and "value: setting.name" in SOURCE
    for name in ("MODEL_PATH", "MODEL_DOWNLOAD", "MODEL_REPO_ID", "MODEL_SUBFOLDER"):
        assert name in SIDECAR_VARIABLES and name in settings


def test_the_sidecar_writes_its_disk_tier_to_local_tmp() -> None:
    """Conversations pushed out of the sidecar's RAM go to the container's own /tmp (local
    disk), not to the /home share (network storage), within a size the docs state."""
    settings = app_settings()
    assert resolve(settings["PROMPT_CACHE_DIR"]).startswith("/tmp/")
    disk_mb = int(resolve(settings["PROMPT_CACHE_DISK_MB"]))
    assert 0 < disk_mb <= 8192
    assert "sidecarKvCacheVariables" in containers()["phi3"]["body"]
    for name in ("PROMPT_CACHE_DIR", "PROMPT_CACHE_DISK_MB"):
        assert name in SIDECAR_VARIABLES
    Settings(
        prompt_cache_dir=Path(resolve(settings["PROMPT_CACHE_DIR"])), prompt_cache_disk_mb=disk_mb
    )


def test_site_runs_sitecontainers_with_home_storage_and_health_check() -> None:
    (site,) = of_type("Microsoft.Web/sites")
    body = site["body"]
    assert resolve(value(body, "linuxFxVersion")) == "SITECONTAINERS"
    assert resolve(value(body, "healthCheckPath")) == "/readyz"  # the next test says why
    assert value(body, "acrUseManagedIdentityCreds") == "true"
    settings = app_settings()
    assert resolve(settings["WEBSITES_ENABLE_APP_SERVICE_STORAGE"]) == "true"
    assert settings["MODEL_PATH"] == "modelPath"
    assert params()["modelPath"] == "'/home/models/phi3-mini-4k-instruct-int4'"
    assert (
        str(Settings.model_fields["model_path"].default)
        == "/home/models/phi3-mini-4k-instruct-int4"
    )
    assert resolve(settings["MODEL_DOWNLOAD"]) == "1"


def test_the_health_check_path_is_200_only_when_the_instance_can_serve_a_chat() -> None:
    """App Service pings healthCheckPath to decide when a new instance gets chats and when a
    broken one stops getting them: the app's route there answers 503 while its sidecar is
    down, loading or refusing the app's key, and 200 once a chat can be served. (/healthz,
    which the page polls, is 200 in all of these: it made a loading instance take chats.)"""
    from chatapp import create_app
    from scripts.run.services import free_port
    from tests.chatapp.fake_sidecar import FakeSidecar

    (site,) = of_type("Microsoft.Web/sites")
    path = resolve(value(site["body"], "healthCheckPath"))
    config = {"TESTING": True, "SIDECAR_CONNECT_TIMEOUT": 1.0}
    down = create_app({**config, "SIDECAR_URL": f"http://127.0.0.1:{free_port()}"})
    assert down.test_client().get(path).status_code == 503
    with FakeSidecar() as fake:
        client = create_app({**config, "SIDECAR_URL": fake.url}).test_client()
        assert client.get(path).status_code == 200
        fake.readyz = (503, {"ready": False, "phase": "loading"})
        assert client.get(path).status_code == 503
        assert client.get("/healthz").status_code == 200
        fake.readyz = (503, {"ready": False, "phase": "restarting"})
        assert client.get(path).status_code == 503
        fake.readyz, fake.models = (200, {"ready": True, "phase": "ready"}), (401, {})
        assert client.get(path).status_code == 503  # every chat would be refused 401


def test_arr_affinity_keeps_a_browser_on_the_instance_that_holds_its_cache() -> None:
    """Each sidecar keeps its conversations' KV caches in its own memory: with affinity off,
    each turn of a chat on two or more instances landed anywhere and missed its cache."""
    (site,) = of_type("Microsoft.Web/sites")
    assert value(site["body"], "clientAffinityEnabled") == "true"
    assert "clientAffinityEnabled: false" not in SOURCE


def test_health_check_ping_failures_are_set_and_documented() -> None:
    """WEBSITE_HEALTHCHECK_MAXPINGFAILURES: within App Service's range (2 to 10), more than the
    pings a worker restart can miss (two: it lasts under two minutes), and stated in
    docs/deploy.md."""
    failures = int(resolve(app_settings()["WEBSITE_HEALTHCHECK_MAXPINGFAILURES"]))
    assert 2 < failures <= 10
    deploy = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert f"`WEBSITE_HEALTHCHECK_MAXPINGFAILURES` = `{failures}`" in deploy


def test_images_are_pulled_with_a_user_assigned_identity_not_passwords() -> None:
    for resource in of_type("Microsoft.Web/sites/sitecontainers"):
        body = resource["body"]
        assert resolve(value(body, "authType")) == "UserAssigned"
        assert value(body, "userManagedIdentityClientId") == "pullIdentity.properties.clientId"
        assert "passwordSecret" not in body and "userName" not in body
        assert value(body, "image").startswith("'${registry.properties.loginServer}/phi3-chat/")
    (registry,) = of_type("Microsoft.ContainerRegistry/registries")
    assert value(registry["body"], "adminUserEnabled") == "false"
    (assignment,) = of_type("Microsoft.Authorization/roleAssignments")
    assert variables()["acrPullRoleId"] == ACR_PULL
    assert value(assignment["body"], "scope") == "registry"
    assert value(assignment["body"], "principalId") == "pullIdentity.properties.principalId"


def test_plan_is_linux_premium_v3_and_instances_are_a_parameter() -> None:
    (plan,) = of_type("Microsoft.Web/serverfarms")
    assert value(plan["body"], "reserved").startswith("true")
    assert value(plan["body"], "capacity") == "instanceCount"
    sku = plan["body"][plan["body"].index("sku: ") + 5 :]
    assert value(block(sku, 0), "name") == "planSku"
    allowed = block(SOURCE, SOURCE.index("@allowed([") + 9)
    assert all(re.fullmatch(r"P\d+m?v3", sku) for sku in re.findall(r"'(\w+)'", allowed))
    assert params()["planSku"] == "'P1v3'"
    assert params()["instanceCount"] == "1"


def test_parameters_file_fills_every_required_parameter() -> None:
    declared = params()
    given = json.loads((REPO / "infra" / "main.parameters.json").read_text())["parameters"]
    assert set(given) <= set(declared)
    required = {name for name, default in declared.items() if default is None}
    assert required <= set(given)


def test_outputs_name_what_the_deploy_script_reads() -> None:
    outputs = set(re.findall(r"^output (\w+) ", SOURCE, re.M))
    script = (REPO / "infra" / "deploy.sh").read_text()
    read = set(re.findall(r'output "\$group" (\w+)', script))
    read |= set(re.findall(r"\$\{(AZURE_\w+|WEBAPP_\w+|IMAGE_TAG|MODEL_SOURCE)[:}]", script))
    assert read and read <= outputs


@pytest.fixture(scope="module")
def azure_yaml() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "azure.yaml").read_text())
    return data


def test_azure_yaml_provisions_main_bicep_and_builds_in_a_hook(azure_yaml: dict[str, Any]) -> None:
    assert azure_yaml["infra"]["provider"] == "bicep"
    infra = REPO / azure_yaml["infra"]["path"]
    assert (infra / f"{azure_yaml['infra']['module']}.bicep") == BICEP
    # azd's App Service host would overwrite SITECONTAINERS with DOCKER|image: no services.
    assert "services" not in azure_yaml
    hook = azure_yaml["hooks"]["postprovision"]["posix"]["run"].split()
    script = REPO / hook[0]
    assert script.is_file() and os.access(script, os.X_OK)
    assert hook[1:] == ["--azd-postprovision"]
    assert "--azd-postprovision)" in script.read_text()


def test_application_insights_is_optional_and_feeds_both_containers() -> None:
    """Behind useApplicationInsights (default off): a workspace-based Application Insights
    resource whose connection string both containers read under its own name."""
    assert params()["useApplicationInsights"] == "false"
    given = json.loads((REPO / "infra" / "main.parameters.json").read_text())["parameters"]
    assert given["useApplicationInsights"]["value"] == "${USE_APPLICATION_INSIGHTS=false}"
    (insights,) = of_type("Microsoft.Insights/components")
    (workspace,) = of_type("Microsoft.OperationalInsights/workspaces")
    for resource in (insights, workspace):
        assert f"resource {resource['symbol']} '" in SOURCE
        assert re.search(
            rf"^resource {resource['symbol']} .* = if \(useApplicationInsights\) ", SOURCE, re.M
        )
    assert value(insights["body"], "WorkspaceResourceId") == "logAnalytics.id"
    start = SOURCE.index("var telemetrySettings = ")
    (setting,) = name_value_pairs(block(SOURCE, SOURCE.index("[", start)))
    assert setting == (
        "APPLICATIONINSIGHTS_CONNECTION_STRING",
        "appInsights.properties.ConnectionString",
    )
    assert "telemetrySettings\n)" in SOURCE  # part of the app settings
    # Read by both services, and given to both containers by the same name.
    variable = setting[0]
    assert app_reads(variable) and variable in SIDECAR_VARIABLES
    for container in containers().values():
        body = container["body"]
        assert "telemetryVariables" in block(body, body.index("environmentVariables: ") + 22)
    assert "var telemetryVariables = [for setting in telemetrySettings: {" in SOURCE


def test_the_start_time_limit_comes_from_the_measured_start() -> None:
    """WEBSITES_CONTAINER_START_TIME_LIMIT: ten times the measured start-to-ready upper bound
    (docs/benchmarks/container-start.md, "Container start"), in whole minutes, never below App
    Service's own default (230 s) nor above its maximum (1800 s)."""
    text = (REPO / "docs" / "benchmarks" / "container-start.md").read_text(encoding="utf-8")
    found = re.search(r"Container start to ready, upper bound: \*\*(\d+) s\*\*", text)
    assert found, "docs/benchmarks/container-start.md lost its 'Container start' figure"
    measured = int(found[1])
    limit = int(resolve(app_settings()["WEBSITES_CONTAINER_START_TIME_LIMIT"]))
    assert limit == max(230, math.ceil(10 * measured / 60) * 60) <= 1800
    assert f"**{limit} s**" in text  # the page states the value the Bicep sets


def test_easy_auth_is_an_option_that_signs_people_in_before_the_app() -> None:
    declared = params()
    assert declared["enableEasyAuth"] == "false" and "easyAuthClientId" in declared
    [auth] = [r for r in of_type("Microsoft.Web/sites/config") if "authsettingsV2" in r["body"]]
    assert "if (enableEasyAuth)" in SOURCE[SOURCE.index("resource authSettings") :][:200]
    body = auth["body"]
    assert value(body, "requireAuthentication") == "true"
    assert value(body, "clientId") == "easyAuthClientId"
    assert "'/readyz'" in body  # App Service's health check is never sent to sign in
    # The app believes the platform's headers exactly when Easy Auth is on.
    assert "var authMode = enableEasyAuth ? 'appservice' : 'none'" in SOURCE
    main = containers()["main"]["body"]
    assert "{ name: 'AUTH_MODE', value: 'AUTH_MODE' }" in main
    assert from_environ({"AUTH_MODE": "appservice"})["AUTH_MODE"] == "appservice"


def test_the_database_url_is_a_secure_parameter_given_to_the_app_alone() -> None:
    assert re.search(r"@secure\(\)\n(@description\(.*\)\n)?param databaseUrl string = ''", SOURCE)
    assert "databaseVariables" in containers()["main"]["body"]
    assert "databaseVariables" not in containers()["phi3"]["body"]


def test_autoscale_is_an_option_on_cpu_and_http_queue_length() -> None:
    [autoscale] = of_type("Microsoft.Insights/autoscalesettings")
    body = autoscale["body"]
    assert "if (enableAutoscale)" in SOURCE[SOURCE.index("resource autoscale") :][:200]
    metrics = re.findall(r"metricName: '(\w+)'", body)
    assert set(metrics) == {"CpuPercentage", "HttpQueueLength"}
    assert value(body, "targetResourceUri") == "plan.id"
    # ARR affinity stays on: the conversation cache lives in each instance's sidecar.
    assert value(of_type("Microsoft.Web/sites")[0]["body"], "clientAffinityEnabled") == "true"


POSTGRES_TYPES = {
    "Microsoft.DBforPostgreSQL/flexibleServers",
    "Microsoft.DBforPostgreSQL/flexibleServers/configurations",
    "Microsoft.DBforPostgreSQL/flexibleServers/databases",
    "Microsoft.DBforPostgreSQL/flexibleServers/firewallRules",
}


def postgres_resources() -> dict[str, dict[str, str]]:
    return {r["type"]: r for r in resources() if r["type"] in POSTGRES_TYPES}


def test_postgres_is_an_option_off_by_default() -> None:
    """usePostgres (default off, azd's USE_POSTGRES): every PostgreSQL resource exists only
    with it, at the GA API version of Microsoft's reference (2024-08-01); off, the app gets no
    DATABASE_URL from it and keeps SQLite (or databaseUrl, as before)."""
    assert params()["usePostgres"] == "false"
    given = json.loads((REPO / "infra" / "main.parameters.json").read_text())["parameters"]
    assert given["usePostgres"]["value"] == "${USE_POSTGRES=false}"
    found = postgres_resources()
    assert set(found) == POSTGRES_TYPES
    for resource in found.values():
        assert resource["api"] == "2024-08-01", resource["type"]
        assert re.search(
            rf"^resource {resource['symbol']} '[^']+' = if \(usePostgres\) \{{", SOURCE, re.M
        ), resource["symbol"]
    assert "var appDatabaseUrl = usePostgres\n" in SOURCE
    assert SOURCE.count(": databaseUrl\n") == 1  # the else branch: the URL given, if any
    assert (
        "var databaseSettings = empty(appDatabaseUrl) ? [] : "
        "[{ name: 'DATABASE_URL', value: appDatabaseUrl }]" in SOURCE
    )


def test_postgres_allow_lists_pgvector_and_children_are_made_one_at_a_time() -> None:
    """The extension the app creates (`CREATE EXTENSION ... vector`, documents/index/postgres.py) is
    allow-listed in azure.extensions; the server refuses concurrent changes to its children,
    so each waits for the one before."""
    found = postgres_resources()
    server = found["Microsoft.DBforPostgreSQL/flexibleServers"]
    extensions = found["Microsoft.DBforPostgreSQL/flexibleServers/configurations"]
    assert resolve(value(extensions["body"], "name")) == "azure.extensions"
    allowed = resolve(value(extensions["body"], "value")).lower().split(",")
    assert "vector" in allowed
    index_code = REPO / "main-app" / "chatapp" / "documents" / "index" / "postgres.py"
    assert "CREATE EXTENSION IF NOT EXISTS vector" in index_code.read_text()
    assert resolve(value(extensions["body"], "source")) == "user-override"
    database = found["Microsoft.DBforPostgreSQL/flexibleServers/databases"]
    firewall = found["Microsoft.DBforPostgreSQL/flexibleServers/firewallRules"]
    for child in (extensions, database, firewall):
        assert value(child["body"], "parent") == server["symbol"]
    assert extensions["symbol"] in block(
        database["body"], database["body"].index("dependsOn: ") + 11
    )
    assert database["symbol"] in block(firewall["body"], firewall["body"].index("dependsOn: ") + 11)
    # The site starts (and the app migrates) once the server takes connections from it.
    (site,) = of_type("Microsoft.Web/sites")
    depends = block(site["body"], site["body"].index("dependsOn: ") + 11)
    assert firewall["symbol"] in depends
    assert resolve(value(firewall["body"], "startIpAddress")) == "0.0.0.0"
    body = server["body"]
    assert resolve(value(body, "version")) >= "13"  # docs/deploy.md: 13 or later
    assert value(body, "administratorLoginPassword") == "postgresAdminPassword"
    assert resolve(value(body, "passwordAuth")) == "Enabled"


def test_postgres_password_is_secure_and_in_no_output() -> None:
    assert re.search(
        r"@secure\(\)\n(@description\(.*\)\n)?param postgresAdminPassword string = ''", SOURCE
    )
    outputs = re.findall(r"^output .*$", SOURCE, re.M)
    assert outputs and not any("postgres" in line.lower() for line in outputs)
    assert not any("databaseurl" in line.lower() for line in outputs)
    # Given to the app alone, through the same DATABASE_URL setting as databaseUrl.
    assert "databaseVariables" not in containers()["phi3"]["body"]


def test_the_postgres_url_is_one_the_app_takes_with_tls_required() -> None:
    """The DATABASE_URL the template builds, with a password full of URL syntax: the app's
    settings take it, SQLAlchemy reads back the same password (uriComponent), the psycopg
    driver, the database made, sslmode=require."""
    from urllib.parse import quote

    from sqlalchemy.engine import make_url

    start = SOURCE.index("var appDatabaseUrl = usePostgres\n")
    template = re.search(r"\? '([^']+)'\n", SOURCE[start:])
    assert template
    password = "p@ss:w/rd?#%&="
    url = (
        template[1]
        .replace("${postgresAdminLogin}", "phi3chat")
        .replace("${uriComponent(postgresAdminPassword)}", quote(password, safe="-_.!~*'()"))
        .replace(
            "${postgres.properties.fullyQualifiedDomainName}", "psql-x.postgres.database.azure.com"
        )
        .replace("${postgresDatabaseName}", variables()["postgresDatabaseName"])
    )
    assert "${" not in url
    assert from_environ({"DATABASE_URL": url})["DATABASE_URL"] == url
    parsed = make_url(url)
    assert parsed.drivername == "postgresql+psycopg"
    assert parsed.password == password
    assert parsed.database == variables()["postgresDatabaseName"]
    assert parsed.port == 5432
    assert parsed.query == {"sslmode": "require"}
    database = postgres_resources()["Microsoft.DBforPostgreSQL/flexibleServers/databases"]
    assert value(database["body"], "name") == "postgresDatabaseName"


def test_postgres_compute_holds_the_apps_connections_and_is_documented() -> None:
    """The default SKU is burstable, its tier follows the name, and docs/deploy.md says what
    the option costs and when to turn it on."""
    assert params()["postgresSku"] == "'Standard_B2s'"
    server = postgres_resources()["Microsoft.DBforPostgreSQL/flexibleServers"]
    tier = value(server["body"], "tier")
    assert tier == "startsWith(postgresSku, 'Standard_B') ? 'Burstable' : 'GeneralPurpose'"
    allowed = block(
        SOURCE, SOURCE.index("[", SOURCE.rindex("@allowed([", 0, SOURCE.index("param postgresSku")))
    )
    assert all(
        re.fullmatch(r"Standard_(B\d+m?s|D\d+ds_v5)", sku)
        for sku in re.findall(r"'(\w+)'", allowed)
    )
    deploy = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert "`usePostgres=true`" in deploy and "USE_POSTGRES" in deploy
    assert "Standard_B2s" in deploy and "a month" in deploy


def test_the_app_measures_passages_with_the_sidecars_encoder_tokenizer() -> None:
    """With modelSource=download the sidecar downloads a catalog encoder into /home/models and
    the app (which sees the same /home) names that folder in EMBED_TOKENIZER: its passages are
    cut by the very tokenizer.json the sidecar encodes with."""
    from sidecar.embeddings import catalog

    settings = app_settings()
    encoder = variables()["encoderName"]
    assert settings["EMBED_MODEL_ID"] == "encoderName" and encoder in catalog.ENTRIES
    folder = Settings(embed_model_id=encoder).embed_model_path
    assert folder is not None and str(folder).startswith("/home/")
    assert resolve(settings["EMBED_TOKENIZER"]) == str(folder)
    assert from_environ({"EMBED_TOKENIZER": str(folder)})["EMBED_TOKENIZER"] == str(folder)
    main, sidecar = containers()["main"]["body"], containers()["phi3"]["body"]
    assert "modelSource == 'download' ? appEncoderVariables : []" in main
    assert "appEncoderVariables" not in sidecar and "EMBED_TOKENIZER" not in sidecar
    assert "var appEncoderVariables = [for setting in appEncoderSettings: {" in SOURCE
    assert "modelSource == 'download' ? concat(downloadSettings, appEncoderSettings) : []" in SOURCE

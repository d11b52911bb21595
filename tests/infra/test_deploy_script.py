"""infra/deploy.sh run against a fake `az` (and a fake docker) that record their calls: the
order of the steps, the parameters given to the Bicep deployment, and the error messages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "deploy.sh"

# A stand-in for the Azure CLI: answers what deploy.sh asks, keeps state in a JSON file, and
# appends each call's arguments to a log.
FAKE_AZ = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys
    args = sys.argv[1:]
    state_file = os.environ["FAKE_AZ_STATE"]
    state = json.load(open(state_file)) if os.path.exists(state_file) else {{}}
    with open(os.environ["FAKE_AZ_LOG"], "a") as log:
        log.write(json.dumps(args) + "\\n")
    for a in args:  # a parameters file: what it held when az read it, and its mode
        if a.startswith("@"):
            with open(os.environ["FAKE_AZ_LOG"] + ".files", "a") as log:
                mode = os.stat(a[1:]).st_mode & 0o777
                log.write(json.dumps([a[1:], mode, json.load(open(a[1:]))]) + "\\n")
    def arg(name):
        return args[args.index(name) + 1]
    def save():
        json.dump(state, open(state_file, "w"))
    if args[:2] == ["group", "show"]:
        if "group" not in state:
            sys.exit(3)
        if "--query" in args:
            print(state["group"])
    elif args[:2] == ["group", "create"]:
        state["group"] = arg("--location"); save()
    elif args[:3] == ["deployment", "group", "show"]:
        if "outputs" not in state:
            sys.exit(3)
        print(state["outputs"][arg("--query").split(".")[2]])
    elif args[:3] == ["deployment", "group", "create"]:
        state["outputs"] = {{
            "AZURE_CONTAINER_REGISTRY_NAME": "crtoken",
            "WEBAPP_NAME": "app-phi3chat-token",
            "WEBAPP_URL": "https://app-phi3chat-token.azurewebsites.net",
        }}
        save()
    elif args[:2] == ["acr", "show"]:
        print("crtoken.azurecr.io")
    elif args[:2] == ["acr", "login"]:
        print("token")
    """
)
FAKE_DOCKER = '#!/bin/sh\necho "$@" >> "$FAKE_AZ_LOG.docker"\ncat > /dev/null\n'


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    az = bin_dir / "az"
    az.write_text(FAKE_AZ.format(python=shutil.which("python3")))
    docker = bin_dir / "fake-docker"
    docker.write_text(FAKE_DOCKER)
    for tool in (az, docker):
        tool.chmod(0o755)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "FAKE_AZ_STATE": str(tmp_path / "state.json"),
        "FAKE_AZ_LOG": str(tmp_path / "az.log"),
    }


def deploy(env: dict[str, str], *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def calls(env: dict[str, str]) -> list[list[str]]:
    lines = Path(env["FAKE_AZ_LOG"]).read_text().splitlines()
    return [json.loads(line) for line in lines]


def steps(env: dict[str, str]) -> list[str]:
    """The calls that change something, in order, named briefly."""
    names = []
    for call in calls(env):
        if call[:2] == ["acr", "build"]:
            names.append("build " + call[call.index("--image") + 1].split(":")[0])
        elif call[:3] == ["deployment", "group", "create"]:
            names.append("deploy")
        elif call[:2] in (["group", "create"], ["webapp", "restart"]):
            names.append(" ".join(call[:2]))
    return names


def parameters(env: dict[str, str]) -> dict[str, str]:
    (*_, last) = (c for c in calls(env) if c[:3] == ["deployment", "group", "create"])
    start = last.index("--parameters") + 1
    return dict(a.split("=", 1) for a in last[start:] if "=" in a)


def test_first_run_deploys_infra_then_builds_then_restarts(env: dict[str, str]) -> None:
    result = deploy(env, "-g", "rg-chat", "-l", "westeurope", "-t", "v1", "--no-smoke")
    assert result.returncode == 0, result.stderr
    assert steps(env) == [
        "group create",
        "deploy",
        "build phi3-chat/app",
        "build phi3-chat/sidecar",
        "webapp restart",
    ]
    params: dict[str, Any] = parameters(env)
    assert params["imageTag"] == "v1" and params["modelSource"] == "download"
    assert params["location"] == "westeurope" and params["planSku"] == "P1v3"
    (sidecar,) = [c for c in calls(env) if "phi3-chat/sidecar:v1" in c]
    assert sidecar[sidecar.index("--target") + 1] == "runtime"
    assert "https://app-phi3chat-token.azurewebsites.net" in result.stdout


def test_later_runs_build_the_images_before_pointing_the_site_at_them(
    env: dict[str, str],
) -> None:
    assert deploy(env, "-g", "rg", "-l", "westeurope", "--no-smoke").returncode == 0
    Path(env["FAKE_AZ_LOG"]).unlink()
    result = deploy(env, "-g", "rg", "--instances", "3", "--sku", "P2v3", "--no-smoke")
    assert result.returncode == 0, result.stderr
    assert steps(env) == ["build phi3-chat/app", "build phi3-chat/sidecar", "deploy"]
    params = parameters(env)
    assert params["instanceCount"] == "3" and params["planSku"] == "P2v3"
    assert params["imageTag"]  # a fresh tag made from the commit and the time
    assert params["useApplicationInsights"] == "false"
    Path(env["FAKE_AZ_LOG"]).unlink()
    assert deploy(env, "-g", "rg", "--app-insights", "--no-smoke").returncode == 0
    assert parameters(env)["useApplicationInsights"] == "true"


def test_postgres_gets_its_password_from_the_environment_never_on_a_command_line(
    env: dict[str, str],
) -> None:
    """--postgres: usePostgres=true, and the password (from POSTGRES_ADMIN_PASSWORD, JSON's
    special characters and all) in a parameters file only this user may read, removed after;
    no az call's arguments hold it. Without the variable: one clear line."""
    password = 'p"a\\ss w0rd$%!'
    result = deploy(env, "-g", "rg", "-l", "westeurope", "--postgres", "--no-smoke")
    assert result.returncode == 1
    assert "--postgres needs POSTGRES_ADMIN_PASSWORD set" in result.stderr.splitlines()[-1]
    result = deploy(
        env, "-g", "rg", "-l", "westeurope", "--postgres", "--no-smoke",
        POSTGRES_ADMIN_PASSWORD=password,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert parameters(env)["usePostgres"] == "true"
    assert all(password not in " ".join(call) for call in calls(env))
    lines = Path(env["FAKE_AZ_LOG"] + ".files").read_text().splitlines()
    (path, mode, given) = json.loads(lines[-1])
    assert given == {"postgresAdminPassword": {"value": password}}
    assert mode & 0o077 == 0 and not Path(path).exists()
    Path(env["FAKE_AZ_LOG"]).unlink()
    assert deploy(env, "-g", "rg", "--no-smoke").returncode == 0
    assert parameters(env)["usePostgres"] == "false"


def test_model_dir_bakes_the_model_in_with_a_local_build(
    env: dict[str, str], tmp_path: Path
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "genai_config.json").write_text("{}")
    cli = str(tmp_path / "bin" / "fake-docker")
    args = ("-g", "rg", "-l", "x", "-t", "v2", "--model-dir", str(model), "--no-smoke")
    result = deploy(env, *args, CONTAINER_CLI=cli)
    assert result.returncode == 0, result.stderr
    assert steps(env) == ["group create", "deploy", "build phi3-chat/app", "webapp restart"]
    assert parameters(env)["modelSource"] == "image"
    docker = Path(env["FAKE_AZ_LOG"] + ".docker").read_text().splitlines()
    assert docker[0].startswith(f"build --build-context model={model} ")
    assert docker[1].startswith("login crtoken.azurecr.io ")
    assert docker[2] == "push crtoken.azurecr.io/phi3-chat/sidecar:v2"


def test_azd_hook_builds_under_the_provisioned_tag_and_restarts(env: dict[str, str]) -> None:
    azd = {
        "AZURE_RESOURCE_GROUP": "rg",
        "AZURE_CONTAINER_REGISTRY_NAME": "crtoken",
        "WEBAPP_NAME": "app-x",
        "IMAGE_TAG": "latest",
    }
    result = deploy(env, "--azd-postprovision", **azd)
    assert result.returncode == 0, result.stderr
    assert steps(env) == ["build phi3-chat/app", "build phi3-chat/sidecar", "webapp restart"]
    images = [c[c.index("--image") + 1] for c in calls(env) if c[:2] == ["acr", "build"]]
    assert images == ["phi3-chat/app:latest", "phi3-chat/sidecar:latest"]


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        ((), 2, "-g RESOURCE_GROUP is required"),
        (("-g", "rg", "--bogus"), 2, "unknown argument: --bogus"),
        (("-g", "rg"), 1, "resource group rg does not exist: give -l LOCATION"),
        (("-g", "rg", "--instances", "two"), 1, "--instances must be a whole number"),
        (("-g", "rg", "--model-dir", "/nonexistent"), 1, "has no genai_config.json"),
    ],
)
def test_errors_are_one_clear_line(
    env: dict[str, str], args: tuple[str, ...], status: int, message: str
) -> None:
    result = deploy(env, *args)
    assert result.returncode == status
    assert message in result.stderr.splitlines()[-1]


def test_help_and_no_az(env: dict[str, str]) -> None:
    result = deploy(env, "--help")
    assert result.returncode == 0 and "usage:" in result.stderr
    result = deploy({**env, "PATH": "/usr/bin:/bin"}, "-g", "rg")
    if shutil.which("az", path="/usr/bin:/bin") is None:
        assert result.returncode == 1 and "az) is not installed" in result.stderr


def test_shellcheck_is_clean() -> None:
    run = REPO / "scripts" / "run"
    scripts = [SCRIPT, run / "setup_podman.sh", run / "container_base.sh"]
    for script in scripts:
        assert os.access(script, os.X_OK), script
        assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    result = subprocess.run(
        ["shellcheck", *map(str, scripts)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout

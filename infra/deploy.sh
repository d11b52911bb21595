#!/usr/bin/env bash
# Deploy the chat pair to Azure App Service with the az CLI alone (no azd, no local Docker
# unless a model is baked in): infra/main.bicep, both images built in the registry with
# `az acr build`, then a smoke test. See docs/deploy.md.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEPLOYMENT=phi3-chat  # the deployment's name; its outputs name the registry on later runs

usage() {
    cat >&2 <<EOF
usage: $0 -g RESOURCE_GROUP [-l LOCATION] [options]
       $0 --azd-postprovision        (run by azd; reads the azd environment)

Creates or updates: a container registry, a managed identity that may pull from it, a Linux
App Service plan and a web app running the app (main container, port 8080) and the Phi-3
sidecar (port 8000). Builds and pushes both images, points the app at them, then runs
scripts/run/smoke_test.py against it.

  -g, --resource-group NAME  resource group (created in LOCATION if missing)
  -l, --location REGION      region for a new resource group (default: \$AZURE_LOCATION)
  -e, --env-name NAME        prefix of the resource names (default: phi3chat)
  -t, --tag TAG              image tag (default: git commit + time, e.g. 1a2b3c4-20250101120000)
      --sku SKU              App Service plan SKU (default: P1v3)
      --instances N          number of instances, each running its own pair (default: 1)
      --model-dir DIR        bake the model folder DIR into the sidecar image (built locally
                             with docker or podman, then pushed); default: the sidecar
                             downloads the model into /home on its first start
      --app-insights         create Application Insights and send both containers' traces
                             to it (docs/operations.md)
      --postgres             create an Azure Database for PostgreSQL flexible server
                             (pgvector) for the app's users, chats and documents, shared by
                             every instance; its password from \$POSTGRES_ADMIN_PASSWORD
      --no-smoke             do not run the smoke test
  -h, --help                 this message
EOF
}

die() {
    echo "$0: $*" >&2
    exit 1
}

# Build both images in the registry (the sidecar locally when a model is baked in).
build_images() {
    local registry=$1 tag=$2 model_dir=$3
    echo "building phi3-chat/app:$tag in $registry"
    az acr build --registry "$registry" --image "phi3-chat/app:$tag" \
        --file "$ROOT/main-app/Dockerfile" "$ROOT/main-app"
    if [ -z "$model_dir" ]; then
        echo "building phi3-chat/sidecar:$tag (no model inside) in $registry"
        az acr build --registry "$registry" --image "phi3-chat/sidecar:$tag" --target runtime \
            --file "$ROOT/phi3-sidecar/Dockerfile" "$ROOT/phi3-sidecar"
        return
    fi
    # ACR Tasks cannot take a second build context, so an image with the model is built here.
    local cli server image
    cli=${CONTAINER_CLI:-$(command -v docker || command -v podman || true)}
    [ -n "$cli" ] || die "--model-dir needs docker or podman on this machine"
    server=$(az acr show --name "$registry" --query loginServer --output tsv)
    image="$server/phi3-chat/sidecar:$tag"
    echo "building $image with $cli, model from $model_dir"
    "$cli" build --build-context "model=$model_dir" --tag "$image" \
        --file "$ROOT/phi3-sidecar/Dockerfile" "$ROOT/phi3-sidecar"
    az acr login --name "$registry" --expose-token --query accessToken --output tsv \
        | "$cli" login "$server" --username 00000000-0000-0000-0000-000000000000 \
            --password-stdin
    "$cli" push "$image"
}

# The database password goes to az in a parameters file only this user can read, never on a
# command line (which every user of the machine may list).
secret_parameters() {
    local file=$1 password=${POSTGRES_ADMIN_PASSWORD:?}
    password=${password//\\/\\\\}
    password=${password//\"/\\\"}
    (umask 077 && printf '{"postgresAdminPassword": {"value": "%s"}}\n' "$password" >"$file")
}

deploy_infra() {
    local group=$1 location=$2 env_name=$3 tag=$4 sku=$5 instances=$6 model_source=$7
    local insights=$8 postgres=$9
    local -a secrets=()
    if [ "$postgres" = true ]; then
        SECRETS_FILE=$(mktemp)
        trap 'rm -f "$SECRETS_FILE"' EXIT
        secret_parameters "$SECRETS_FILE"
        secrets=(--parameters "@$SECRETS_FILE")
    fi
    echo "deploying infra/main.bicep to $group (images :$tag, model: $model_source)"
    az deployment group create --resource-group "$group" --name "$DEPLOYMENT" \
        --template-file "$ROOT/infra/main.bicep" \
        --parameters environmentName="$env_name" location="$location" imageTag="$tag" \
        planSku="$sku" instanceCount="$instances" modelSource="$model_source" \
        useApplicationInsights="$insights" usePostgres="$postgres" \
        ${secrets[@]+"${secrets[@]}"} --output none
    if [ "$postgres" = true ]; then rm -f "$SECRETS_FILE"; fi
}

output() {
    az deployment group show --resource-group "$1" --name "$DEPLOYMENT" \
        --query "properties.outputs.$2.value" --output tsv 2>/dev/null || true
}

# azd provisions with infra/main.parameters.json; this hook then builds the images under the
# tag the site already points at and restarts the site so that it pulls them.
azd_postprovision() {
    local group=${AZURE_RESOURCE_GROUP:?not set: run through azd}
    local registry=${AZURE_CONTAINER_REGISTRY_NAME:?not set: run through azd}
    local site=${WEBAPP_NAME:?not set: run through azd}
    local tag=${IMAGE_TAG:-latest} model_dir=""
    if [ "${MODEL_SOURCE:-download}" = image ]; then
        model_dir=${MODEL_DIR:?MODEL_SOURCE=image needs MODEL_DIR, the model folder to bake in}
    fi
    build_images "$registry" "$tag" "$model_dir"
    echo "restarting $site so that it pulls the new images"
    az webapp restart --resource-group "$group" --name "$site"
    echo "deployed: ${WEBAPP_URL:-https://$site.azurewebsites.net} (a first start downloads" \
        "the model; check with: python3 -m scripts.run.smoke_test URL --wait 1800)"
}

main() {
    local group="" location=${AZURE_LOCATION:-} env_name=phi3chat tag="" sku=P1v3
    local instances=1 model_dir="" smoke=1 insights=false postgres=false
    while [ $# -gt 0 ]; do
        case "$1" in
            -g | --resource-group) group=${2:?}; shift 2 ;;
            -l | --location) location=${2:?}; shift 2 ;;
            -e | --env-name) env_name=${2:?}; shift 2 ;;
            -t | --tag) tag=${2:?}; shift 2 ;;
            --sku) sku=${2:?}; shift 2 ;;
            --instances) instances=${2:?}; shift 2 ;;
            --model-dir) model_dir=${2:?}; shift 2 ;;
            --app-insights) insights=true; shift ;;
            --postgres) postgres=true; shift ;;
            --no-smoke) smoke=0; shift ;;
            --azd-postprovision) azd_postprovision; return ;;
            -h | --help) usage; return 0 ;;
            *) usage; echo "$0: unknown argument: $1" >&2; return 2 ;;
        esac
    done
    [ -n "$group" ] || { usage; echo "$0: -g RESOURCE_GROUP is required" >&2; return 2; }
    case "$instances" in '' | *[!0-9]*) die "--instances must be a whole number" ;; esac
    if [ "$postgres" = true ]; then
        [ -n "${POSTGRES_ADMIN_PASSWORD:-}" ] || die "--postgres needs POSTGRES_ADMIN_PASSWORD set"
        case "$POSTGRES_ADMIN_PASSWORD" in
            *[[:cntrl:]]*) die "POSTGRES_ADMIN_PASSWORD holds a control character" ;;
        esac
    fi
    if [ -n "$model_dir" ]; then
        [ -f "$model_dir/genai_config.json" ] || die "$model_dir has no genai_config.json"
    fi
    command -v az >/dev/null || die "the Azure CLI (az) is not installed"
    az account show --output none 2>/dev/null || die "not signed in: run az login"
    if [ -z "$tag" ]; then
        tag="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo build)-$(date -u +%Y%m%d%H%M%S)"
    fi
    local model_source=download
    [ -z "$model_dir" ] || model_source=image

    if ! az group show --name "$group" --output none 2>/dev/null; then
        [ -n "$location" ] || die "resource group $group does not exist: give -l LOCATION"
        az group create --name "$group" --location "$location" --output none
    fi
    location=$(az group show --name "$group" --query location --output tsv)

    local registry first=0
    registry=$(output "$group" AZURE_CONTAINER_REGISTRY_NAME)
    if [ -z "$registry" ]; then
        # First run: the registry must exist before images can be built in it. The site points
        # at the new tag a few minutes before the images are there, and is restarted after.
        first=1
        deploy_infra "$group" "$location" "$env_name" "$tag" "$sku" "$instances" "$model_source" \
            "$insights" "$postgres"
        registry=$(output "$group" AZURE_CONTAINER_REGISTRY_NAME)
    fi
    build_images "$registry" "$tag" "$model_dir"
    local site
    site=$(output "$group" WEBAPP_NAME)
    if [ "$first" -eq 1 ]; then
        az webapp restart --resource-group "$group" --name "$site"
    else
        # Images first, then the site: it never points at a tag that is not built yet.
        deploy_infra "$group" "$location" "$env_name" "$tag" "$sku" "$instances" "$model_source" \
            "$insights" "$postgres"
    fi
    local url
    url=$(output "$group" WEBAPP_URL)
    echo "deployed $tag: $url"
    if [ "$smoke" -eq 1 ]; then
        echo "smoke test (waits while a first start downloads the model, up to 30 minutes)"
        (cd "$ROOT" && python3 -m scripts.run.smoke_test "$url" --wait 1800)
    fi
}

main "$@"

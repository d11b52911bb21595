// Phi-3 chat on Azure App Service (Linux): the chat app (main container, port 8080) and the
// Phi-3 model service (sidecar container, port 8000) in ONE web app, sharing localhost. The
// images live in a private Azure Container Registry and are pulled with a user-assigned managed
// identity (AcrPull role): no registry passwords anywhere.
//
// Deployed by `azd up` (azure.yaml) or infra/deploy.sh (az CLI). See docs/deploy.md.
targetScope = 'resourceGroup'

@description('Name of this deployment environment (azd sets it); prefixes the resource names.')
@minLength(1)
@maxLength(20)
param environmentName string

@description('Azure region of every resource.')
param location string = resourceGroup().location

// Phi-3-mini int4 needs about 4 GB of memory in the sidecar: 2.7 GB of weights, the runtime,
// and a KV cache for each reply in flight. P1v3 (2 vCPU, 8 GB) holds that with room for the
// app and the OS, and is the shape the project's CPU figures were measured on (about 6 tokens/s
// per reply). P0v3 (4 GB) is too small and is not offered. Choose P2v3 (4 vCPU, 16 GB) or a
// memory-optimised P1mv3 (2 vCPU, 16 GB) for more concurrent replies per instance.
@description('App Service plan SKU (Premium v3). P1v3: 2 vCPU, 8 GB.')
@allowed([
  'P1v3'
  'P2v3'
  'P3v3'
  'P1mv3'
  'P2mv3'
  'P3mv3'
])
param planSku string = 'P1v3'

// Scale out: every instance runs its own pair (app + sidecar with its own model in memory). Any
// instance can answer any message (the browser sends the whole conversation each time), but
// each sidecar keeps its conversations' KV caches in its own memory: ARR affinity (below)
// keeps a browser on one instance, so a chat's next turn finds its cache there.
@description('Number of instances; each one runs the app and its own Phi-3 sidecar.')
@minValue(1)
@maxValue(30)
param instanceCount int = 1

@description('Tag of both images in the registry (phi3-chat/app and phi3-chat/sidecar).')
param imageTag string = 'latest'

// download: the sidecar image has no model; on first start it downloads the model into
// modelPath under /home (persistent, shared by every instance), and /readyz reports progress.
// image: the sidecar image has the model baked in (built with --build-context model=DIR) and
// its own MODEL_PATH; nothing is downloaded.
@description('Where the sidecar gets the model: download (into /home on first start) or image.')
@allowed([
  'download'
  'image'
])
param modelSource string = 'download'

@description('Model folder for modelSource=download; must lie under /home to persist.')
param modelPath string = '/home/models/phi3-mini-4k-instruct-int4'

@description('Hugging Face repository of the model (modelSource=download).')
param modelRepoId string = 'microsoft/Phi-3-mini-4k-instruct-onnx'

@description('Folder of the model inside that repository (modelSource=download).')
param modelSubfolder string = 'cpu_and_mobile/cpu-int4-rtn-block-32-acc-level-4'

// 8000 is the sidecar's own default. 11434 is where App Service's built-in model sidecar
// extension (llama.cpp's server) serves: an app written for it as the main container then
// reaches this sidecar at http://localhost:11434/v1/chat/completions with no change.
@description('Port of the model sidecar on localhost: its PORT and targetPort, and the SIDECAR_URL of the app. 11434: the port of the built-in model sidecar extension of App Service.')
@allowed([
  '8000'
  '11434'
])
param sidecarPort string = '8000'

// Traces of both containers in Application Insights (Azure Monitor, workspace-based): each
// container gets APPLICATIONINSIGHTS_CONNECTION_STRING and exports its spans there; the app's
// and the sidecar's spans of one chat share a trace (docs/operations.md). Off: no resource,
// no variable, no telemetry leaves the app.
@description('Create Application Insights (and its Log Analytics workspace) and send the traces of both containers to it.')
param useApplicationInsights bool = false

// Sign-in with Entra ID through App Service's Easy Auth (authsettingsV2): the platform signs
// people in before a request reaches the app and hands it X-MS-CLIENT-PRINCIPAL-ID and -NAME,
// which its front end strips from what clients send; the app runs with AUTH_MODE=appservice
// and keeps each user's chats (docs/deploy.md, "Sign-in"). Needs an app registration: its
// client id, with https://<site>/.auth/login/aad/callback as a redirect URI.
@description('Sign people in with Entra ID (Easy Auth) and keep chats per user on the server.')
param enableEasyAuth bool = false

@description('With enableEasyAuth: the application (client) id of the Entra ID app registration.')
param easyAuthClientId string = ''

@description('With enableEasyAuth: the tenant that signs people in (default: the tenant of this subscription).')
param easyAuthTenantId string = subscription().tenantId

@secure()
@description('With enableEasyAuth: a client secret of the app registration (else ID tokens alone: enable them on the registration).')
param easyAuthClientSecret string = ''

// Users and chats: a PostgreSQL URL (postgresql+psycopg://USER:PASSWORD@HOST:5432/DB?sslmode=require,
// or a Key Vault reference @Microsoft.KeyVault(SecretUri=...)) shared by every instance. Empty:
// each instance keeps its own SQLite file in the container (lost on restart): fine for one
// instance and no sign-in, wrong for several.
@secure()
@description('DATABASE_URL for the app (PostgreSQL, shared by all instances); empty: SQLite per instance.')
param databaseUrl string = ''

// Or let this template make that PostgreSQL: an Azure Database for PostgreSQL flexible server
// (version 16) and its database, with pgvector's `vector` allow-listed in azure.extensions (the
// app runs CREATE EXTENSION vector itself, as the server's admin), and the app's DATABASE_URL
// built from it (sslmode=require). For several instances (each keeps its own SQLite file
// otherwise, so a chat or a document would exist on one instance only). Off: as above.
@description('Create an Azure Database for PostgreSQL flexible server (pgvector) for the users, chats and documents of the app, shared by every instance; databaseUrl is then ignored.')
param usePostgres bool = false

@description('With usePostgres: the administrator login of the server, the user the app connects as.')
param postgresAdminLogin string = 'phi3chat'

// Never in an output. In the app it is part of the DATABASE_URL app setting (readable by whoever
// may read the site's configuration); pass databaseUrl as a Key Vault reference instead to keep
// it there too.
@secure()
@description('With usePostgres: the administrator password (8 to 128 characters of three of: upper case, lower case, digits, symbols).')
param postgresAdminPassword string = ''

// B2s (2 vCores, 4 GiB) allows 429 connections: each instance opens at most 45 (2 workers and
// the indexer, a pool of 5 + 10 each). B1ms allows 50, a single instance's worst case.
@description('With usePostgres: the compute of the server (Burstable B2s: 2 vCores, 4 GiB).')
@allowed([
  'Standard_B1ms'
  'Standard_B2s'
  'Standard_B2ms'
  'Standard_D2ds_v5'
  'Standard_D4ds_v5'
])
param postgresSku string = 'Standard_B2s'

// Autoscale of the plan: out on CPU or on requests waiting in the front end's queue, in
// when both are low. Each new instance starts its own sidecar and loads the model (minutes).
@description('Scale the plan out and in by CPU and HTTP queue length, between instanceCount and autoscaleMaxInstances.')
param enableAutoscale bool = false

@description('With enableAutoscale: the most instances.')
param autoscaleMaxInstances int = 3

var resourceToken = toLower(uniqueString(subscription().id, resourceGroup().id, environmentName))
var tags = {
  'azd-env-name': environmentName
}
var appPort = '8080'
// The catalog encoder (phi3-sidecar/sidecar/embeddings/catalog.py) and its folder's name.
var encoderName = 'all-minilm-l6-v2'
// How long App Service waits for the containers to start before it restarts them (its default
// 230 s, at most 1800). The sidecar took at most 34 s from `podman run` to /readyz ready with
// the Phi-3-mini-shaped model baked in or on a mounted folder, read from disk (AMD EPYC Zen 4,
// 2 shared vCPUs under load: an upper bound; docs/benchmarks/container-start.md). The
// limit is ten times that, in whole minutes: room for a slower plan CPU and for /home being
// network storage. It only delays the restart of a start that truly hangs.
var containerStartTimeLimit = '360'
// Consecutive failed health check pings (one a minute) before App Service takes an instance out
// of the load balancer (its default 10, at least 2). A worker restart (a back-off of 1 to 30 s,
// then a load of tens of seconds) misses two pings at most, so it never takes an instance out;
// an instance that cannot serve for three minutes (a model that failed to load, a worker that
// keeps dying) stops getting chats then, not after ten. With one instance nothing is removed.
var healthCheckMaxPingFailures = '3'
// The database the app keeps its users, chats and documents in, on the server of usePostgres.
var postgresDatabaseName = 'phi3chat'
// Built-in role "AcrPull".
var acrPullRoleId = '7f951dda-4ed3-4680-a7ca-43fe172d538d'

resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' = {
  name: 'cr${resourceToken}'
  location: location
  tags: tags
  sku: {
    name: 'Basic'
  }
  properties: {
    adminUserEnabled: false
  }
}

resource pullIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'id-${environmentName}-${resourceToken}'
  location: location
  tags: tags
}

resource acrPull 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(registry.id, pullIdentity.id, acrPullRoleId)
  scope: registry
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', acrPullRoleId)
    principalId: pullIdentity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource logAnalytics 'Microsoft.OperationalInsights/workspaces@2023-09-01' = if (useApplicationInsights) {
  name: 'log-${environmentName}-${resourceToken}'
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: 30
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = if (useApplicationInsights) {
  name: 'appi-${environmentName}-${resourceToken}'
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: logAnalytics.id
  }
}

resource postgres 'Microsoft.DBforPostgreSQL/flexibleServers@2024-08-01' = if (usePostgres) {
  name: 'psql-${environmentName}-${resourceToken}'
  location: location
  tags: tags
  sku: {
    name: postgresSku
    tier: startsWith(postgresSku, 'Standard_B') ? 'Burstable' : 'GeneralPurpose'
  }
  properties: {
    version: '16'
    administratorLogin: postgresAdminLogin
    administratorLoginPassword: postgresAdminPassword
    authConfig: {
      activeDirectoryAuth: 'Disabled'
      passwordAuth: 'Enabled'
    }
    storage: {
      storageSizeGB: 32
      autoGrow: 'Enabled'
    }
    backup: {
      backupRetentionDays: 7
      geoRedundantBackup: 'Disabled'
    }
    highAvailability: {
      mode: 'Disabled'
    }
    network: {
      publicNetworkAccess: 'Enabled'
    }
  }
}

// pgvector's extension is named `vector`; a flexible server creates only allow-listed ones.
// The server's children are made one after another (dependsOn): it refuses concurrent changes.
resource postgresExtensions 'Microsoft.DBforPostgreSQL/flexibleServers/configurations@2024-08-01' = if (usePostgres) {
  parent: postgres
  name: 'azure.extensions'
  properties: {
    value: 'VECTOR'
    source: 'user-override'
  }
}

resource postgresDatabase 'Microsoft.DBforPostgreSQL/flexibleServers/databases@2024-08-01' = if (usePostgres) {
  parent: postgres
  name: postgresDatabaseName
  properties: {
    charset: 'UTF8'
    collation: 'en_US.utf8'
  }
  dependsOn: [
    postgresExtensions
  ]
}

// App Service's outbound addresses are Azure's: this rule (0.0.0.0) lets connections from
// Azure services in. A private network (VNet integration and private access) is the tighter
// choice; docs/deploy.md says so.
resource postgresFirewall 'Microsoft.DBforPostgreSQL/flexibleServers/firewallRules@2024-08-01' = if (usePostgres) {
  parent: postgres
  name: 'AllowAllAzureServicesAndResourcesWithinAzureIps'
  properties: {
    startIpAddress: '0.0.0.0'
    endIpAddress: '0.0.0.0'
  }
  dependsOn: [
    postgresDatabase
  ]
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: 'plan-${environmentName}-${resourceToken}'
  location: location
  tags: tags
  kind: 'linux'
  sku: {
    name: planSku
    capacity: instanceCount
  }
  properties: {
    reserved: true // Linux
  }
}

// Settings that the containers read. A sitecontainer's environmentVariables entry maps a
// variable name in that container to the NAME of one of these settings (its value is looked up
// when the container starts), so each container gets only what it needs and the two PORTs can
// differ. Nothing is inherited wholesale (inheritAppSettingsAndConnectionStrings: false).
var downloadSettings = [
  { name: 'MODEL_PATH', value: modelPath }
  { name: 'MODEL_DOWNLOAD', value: '1' }
  { name: 'MODEL_REPO_ID', value: modelRepoId }
  { name: 'MODEL_SUBFOLDER', value: modelSubfolder }
  // The encoder of /v1/embeddings (documents), downloaded the same way: /home/models/<name>.
  { name: 'EMBED_MODEL_ID', value: encoderName }
]
// The app measures passages with that encoder's own tokenizer.json, read from the same /home
// (both containers mount it); until the sidecar has downloaded it, with a safe byte bound.
var appEncoderSettings = [
  { name: 'EMBED_TOKENIZER', value: '/home/models/${encoderName}' }
]
var appEncoderVariables = [for setting in appEncoderSettings: {
  name: setting.name
  value: setting.name
}]
// The conversation cache's disk tier (docs/conversation-cache.md): conversations pushed out of
// the sidecar's RAM are written to the container's local /tmp (instance-local disk, not the
// /home share, which is network storage) and read back when their users return.
var kvCacheSettings = [
  { name: 'PROMPT_CACHE_DIR', value: '/tmp/phi3-kv-cache' }
  { name: 'PROMPT_CACHE_DISK_MB', value: '4096' }
]
var sidecarKvCacheVariables = [for setting in kvCacheSettings: {
  name: setting.name
  value: setting.name
}]
var telemetrySettings = useApplicationInsights
  ? [
      { name: 'APPLICATIONINSIGHTS_CONNECTION_STRING', value: appInsights.properties.ConnectionString }
    ]
  : []
var authMode = enableEasyAuth ? 'appservice' : 'none'
// ARM's if() evaluates only the branch taken: the server is read only when it exists.
var appDatabaseUrl = usePostgres
  ? 'postgresql+psycopg://${postgresAdminLogin}:${uriComponent(postgresAdminPassword)}@${postgres.properties.fullyQualifiedDomainName}:5432/${postgresDatabaseName}?sslmode=require'
  : databaseUrl
var databaseSettings = empty(appDatabaseUrl) ? [] : [{ name: 'DATABASE_URL', value: appDatabaseUrl }]
var databaseVariables = [for setting in databaseSettings: {
  name: setting.name
  value: setting.name
}]
var easyAuthSecretSetting = 'MICROSOFT_PROVIDER_AUTHENTICATION_SECRET'
var easyAuthSettings = enableEasyAuth && !empty(easyAuthClientSecret)
  ? [{ name: easyAuthSecretSetting, value: easyAuthClientSecret }]
  : []
var appSettings = concat(
  [
    // Mount the persistent /home share into the containers (the downloaded model lives there).
    { name: 'WEBSITES_ENABLE_APP_SERVICE_STORAGE', value: 'true' }
    { name: 'WEBSITES_CONTAINER_START_TIME_LIMIT', value: containerStartTimeLimit }
    { name: 'WEBSITE_HEALTHCHECK_MAXPINGFAILURES', value: healthCheckMaxPingFailures }
    { name: 'APP_PORT', value: appPort }
    { name: 'SIDECAR_URL', value: 'http://localhost:${sidecarPort}' }
    { name: 'SIDECAR_PORT', value: sidecarPort }
    { name: 'AUTH_MODE', value: authMode }
  ],
  databaseSettings,
  easyAuthSettings,
  modelSource == 'download' ? concat(downloadSettings, appEncoderSettings) : [],
  kvCacheSettings,
  telemetrySettings
)
// In the sidecar, each model variable takes the value of the app setting of the same name.
var sidecarModelVariables = [for setting in downloadSettings: {
  name: setting.name
  value: setting.name
}]
// Both containers read the connection string under its own name.
var telemetryVariables = [for setting in telemetrySettings: {
  name: setting.name
  value: setting.name
}]

resource site 'Microsoft.Web/sites@2024-04-01' = {
  name: 'app-${environmentName}-${resourceToken}'
  location: location
  tags: tags
  kind: 'app,linux,container'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${pullIdentity.id}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    // ARR affinity: the front end's ARRAffinity cookie sends a browser back to the instance
    // that answered it, whose sidecar holds the chat's KV cache (the page's same-origin fetches
    // carry the cookie). If that instance goes away the front end picks another one; the chat
    // goes on there, its first turn reading the whole conversation again.
    clientAffinityEnabled: true
    siteConfig: {
      linuxFxVersion: 'SITECONTAINERS'
      acrUseManagedIdentityCreds: true
      acrUserManagedIdentityID: pullIdentity.properties.clientId
      alwaysOn: true
      // The app's /readyz: 200 only when this instance can serve a chat (its sidecar reachable,
      // the model loaded, this app's key accepted), else 503. App Service pings it to decide
      // when a new instance joins the load balancer and when a broken one leaves it. (The
      // app's /healthz stays 200 while the model loads: the page reads it.)
      healthCheckPath: '/readyz'
      http20Enabled: true
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      appSettings: appSettings
    }
  }
  dependsOn: [
    acrPull
    postgresFirewall // the app migrates its database when it starts
  ]
}

// The main container: the only one that receives outside traffic (on 8080).
resource mainContainer 'Microsoft.Web/sites/sitecontainers@2024-04-01' = {
  parent: site
  name: 'main'
  properties: {
    image: '${registry.properties.loginServer}/phi3-chat/app:${imageTag}'
    isMain: true
    targetPort: appPort
    authType: 'UserAssigned'
    userManagedIdentityClientId: pullIdentity.properties.clientId
    inheritAppSettingsAndConnectionStrings: false
    environmentVariables: concat(
      [
        { name: 'PORT', value: 'APP_PORT' }
        { name: 'SIDECAR_URL', value: 'SIDECAR_URL' }
        { name: 'AUTH_MODE', value: 'AUTH_MODE' }
      ],
      databaseVariables,
      modelSource == 'download' ? appEncoderVariables : [],
      telemetryVariables
    )
  }
}

// The sidecar: the Phi-3 model service, reached by the app at http://localhost:8000.
resource sidecarContainer 'Microsoft.Web/sites/sitecontainers@2024-04-01' = {
  parent: site
  name: 'phi3'
  properties: {
    image: '${registry.properties.loginServer}/phi3-chat/sidecar:${imageTag}'
    isMain: false
    targetPort: sidecarPort
    authType: 'UserAssigned'
    userManagedIdentityClientId: pullIdentity.properties.clientId
    inheritAppSettingsAndConnectionStrings: false
    environmentVariables: concat(
      [
        { name: 'PORT', value: 'SIDECAR_PORT' }
      ],
      modelSource == 'download' ? sidecarModelVariables : [],
      sidecarKvCacheVariables,
      telemetryVariables
    )
  }
}

// Easy Auth: every request signed in with Entra ID before it reaches the containers, except
// the probes (App Service's health check reads /readyz).
resource authSettings 'Microsoft.Web/sites/config@2024-04-01' = if (enableEasyAuth) {
  parent: site
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: true
      unauthenticatedClientAction: 'RedirectToLoginPage'
      redirectToProvider: 'azureactivedirectory'
      excludedPaths: [
        '/healthz'
        '/readyz'
      ]
    }
    httpSettings: {
      requireHttps: true
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          openIdIssuer: 'https://login.microsoftonline.com/${easyAuthTenantId}/v2.0'
          clientId: easyAuthClientId
          clientSecretSettingName: empty(easyAuthClientSecret) ? null : easyAuthSecretSetting
        }
        validation: {
          allowedAudiences: [
            'api://${easyAuthClientId}'
          ]
        }
      }
    }
    login: {
      tokenStore: {
        enabled: true
      }
    }
  }
}

// Autoscale: out by one instance when CPU or the HTTP queue stays high for 10 minutes, in by
// one when CPU stays low for 20 (a new instance loads the model before it takes chats, and
// ARR affinity keeps each browser on the instance that holds its conversation cache).
resource autoscale 'Microsoft.Insights/autoscalesettings@2022-10-01' = if (enableAutoscale) {
  name: 'autoscale-${environmentName}-${resourceToken}'
  location: location
  tags: tags
  properties: {
    enabled: true
    targetResourceUri: plan.id
    profiles: [
      {
        name: 'cpu-and-queue'
        capacity: {
          minimum: string(instanceCount)
          maximum: string(max(instanceCount, autoscaleMaxInstances))
          default: string(instanceCount)
        }
        rules: [
          {
            metricTrigger: {
              metricName: 'CpuPercentage'
              metricResourceUri: plan.id
              timeGrain: 'PT1M'
              statistic: 'Average'
              timeWindow: 'PT10M'
              timeAggregation: 'Average'
              operator: 'GreaterThan'
              threshold: 70
            }
            scaleAction: {
              direction: 'Increase'
              type: 'ChangeCount'
              value: '1'
              cooldown: 'PT10M'
            }
          }
          {
            metricTrigger: {
              metricName: 'HttpQueueLength'
              metricResourceUri: plan.id
              timeGrain: 'PT1M'
              statistic: 'Average'
              timeWindow: 'PT10M'
              timeAggregation: 'Average'
              operator: 'GreaterThan'
              threshold: 10
            }
            scaleAction: {
              direction: 'Increase'
              type: 'ChangeCount'
              value: '1'
              cooldown: 'PT10M'
            }
          }
          {
            metricTrigger: {
              metricName: 'CpuPercentage'
              metricResourceUri: plan.id
              timeGrain: 'PT1M'
              statistic: 'Average'
              timeWindow: 'PT20M'
              timeAggregation: 'Average'
              operator: 'LessThan'
              threshold: 30
            }
            scaleAction: {
              direction: 'Decrease'
              type: 'ChangeCount'
              value: '1'
              cooldown: 'PT20M'
            }
          }
        ]
      }
    ]
  }
}

output AZURE_LOCATION string = location
output AZURE_RESOURCE_GROUP string = resourceGroup().name
output AZURE_CONTAINER_REGISTRY_NAME string = registry.name
output AZURE_CONTAINER_REGISTRY_ENDPOINT string = registry.properties.loginServer
output WEBAPP_NAME string = site.name
output WEBAPP_URL string = 'https://${site.properties.defaultHostName}'
output IMAGE_TAG string = imageTag
output MODEL_SOURCE string = modelSource
output APPLICATIONINSIGHTS_NAME string = useApplicationInsights ? appInsights.name : ''

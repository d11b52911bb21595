"""Tests start the services through the same code as the scripts do (scripts/services.py)."""

from scripts.services import (
    APP_DIR,
    REPO,
    SIDECAR_DIR,
    Service,
    chatapp,
    free_port,
    run_service,
    sidecar,
    stop,
    wait_for,
)

__all__ = [
    "APP_DIR",
    "REPO",
    "SIDECAR_DIR",
    "Service",
    "chatapp",
    "free_port",
    "run_service",
    "sidecar",
    "stop",
    "wait_for",
]

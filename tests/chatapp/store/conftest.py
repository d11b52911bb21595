"""Fixtures for the store: a migrated `Store` on each engine (`database_url`, tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chatapp.store import Store, migrate


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    store = Store.open(database_url)
    migrate.upgrade(store.engine)
    yield store
    store.close()

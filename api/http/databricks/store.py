"""`EndpointStore`: serving-endpoint definitions in an embedded SQLite database.

Owns: the file (created on the first write, so a server that never defines an endpoint leaves
nothing behind), its one table, and running every sqlite3 call in a worker thread
(`trio.to_thread`) so the event loop never blocks on disk. Each call opens its own connection:
trio.to_thread has no thread affinity (two calls may run on different threads) and sqlite3
connections are not shared across threads. Writes are serialised by a trio.Lock and committed before they return, so a
definition the API acknowledged survives a restart. Definitions are stored as JSON text
(whatever `api.http.databricks.endpoints.Endpoint` encodes to). Imports trio and the stdlib.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import trio

SCHEMA_VERSION = 1
_CREATE = "CREATE TABLE IF NOT EXISTS serving_endpoints (name TEXT PRIMARY KEY, definition TEXT NOT NULL)"


class EndpointStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = trio.Lock()

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=10)
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            conn.close()
            raise RuntimeError(f"{self.path} was written by a newer Switchyard (schema {version})")
        with conn:
            conn.execute(_CREATE)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return conn

    def _load_sync(self) -> dict[str, str]:
        if not self.path.exists():
            return {}
        conn = self._connect()
        try:
            return dict(conn.execute("SELECT name, definition FROM serving_endpoints ORDER BY name"))
        finally:
            conn.close()

    def _put_sync(self, name: str, definition: str) -> None:
        conn = self._connect()
        try:
            with conn:
                conn.execute(
                    "INSERT INTO serving_endpoints (name, definition) VALUES (?, ?) "
                    "ON CONFLICT(name) DO UPDATE SET definition = excluded.definition",
                    (name, definition),
                )
        finally:
            conn.close()

    def _delete_sync(self, name: str) -> None:
        if not self.path.exists():
            return
        conn = self._connect()
        try:
            with conn:
                conn.execute("DELETE FROM serving_endpoints WHERE name = ?", (name,))
        finally:
            conn.close()

    async def load(self) -> dict[str, str]:
        """Every stored definition, by endpoint name."""
        return await trio.to_thread.run_sync(self._load_sync)

    async def put(self, name: str, definition: str) -> None:
        async with self._lock:
            await trio.to_thread.run_sync(self._put_sync, name, definition)

    async def delete(self, name: str) -> None:
        async with self._lock:
            await trio.to_thread.run_sync(self._delete_sync, name)

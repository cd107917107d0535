"""An agent forwards its node's spool: evidence of workers that died on this node, sent to the writer.

A worker keeps what it could not deliver (and its write-ahead WARNINGs) in
``$RAYSLEUTH_HOME/spool/<run>/node-<node id>/`` on its own node's disk.
When the worker is gone, only that node can read the file, so its agent
streams the file to the run's writer (``EvidenceWriter.ingest``, batches
of :data:`~raysleuth.recorder.spool.READ_BATCH` rows) and removes what
was stored. The writer asks every node's agent to do so every few seconds
(creating missing agents); its own node is also covered by the writer
itself, and rows sent twice are stored once.
"""

from __future__ import annotations

import threading
from typing import Any

from raysleuth import cluster, runtime

__all__ = ["SpoolForwarder"]

#: How long one batch may wait for the writer (seconds).
INGEST_TIMEOUT_S = 30.0


class SpoolForwarder:
    """The forwarding state of one agent: what it sent, the last error."""

    def __init__(self) -> None:
        self.files = 0
        self.rows = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()

    def totals(self) -> dict[str, Any]:
        """Files and rows forwarded so far, and the last error."""
        return {"files": self.files, "rows": self.rows, "last_error": self.last_error}

    def forward(self, writer: Any) -> dict[str, Any]:
        """Send this node's abandoned spool files of the connected run to ``writer`` (its actor handle)."""
        import ray

        # lazy: every CLI command loads agents: the recorder loads when a spool is forwarded
        from raysleuth.recorder import spool

        with self._lock:  # one round at a time: a file is never sent by two threads at once
            node_id = ray.get_runtime_context().get_node_id()
            sent: dict[str, Any] = {"node_id": node_id, "files": 0, "rows": 0, "error": None}
            files = spool.abandoned(runtime.settings().home, cluster.session_name(), [node_id])

            def deliver(header: dict[str, Any], rows: list) -> int:
                return ray.get(writer.ingest.remote(header, rows), timeout=INGEST_TIMEOUT_S)

            for path in files:
                try:
                    sent["rows"] += spool.deliver_file(path, deliver)
                    sent["files"] += 1
                except Exception as error:  # the file stays for the next round
                    sent["error"] = self.last_error = f"{path.name}: {type(error).__name__}: {error}"[:300]
            self.files += sent["files"]
            self.rows += sent["rows"]
            return sent

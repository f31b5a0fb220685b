"""Audit export as JSON Lines or CSV, streamed in batches (bounded memory for millions of events)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

from sqlalchemy import Select

from ..audit import event_dict
from ..db.models import AuditEvent
from ..db.session import Database

CSV_FIELDS = [
    "id",
    "seq",
    "ts",
    "actor",
    "kind",
    "subject",
    "node",
    "plan_id",
    "model",
    "payload_digest",
    "prev_hash",
    "hash",
    "payload",
]


def stream(db: Database, query: Select, fmt: str, batch: int = 2000) -> Iterator[str]:
    """Yield the events of ``query`` (ordered by id) as JSON Lines or CSV text chunks."""
    if fmt == "csv":
        buf = io.StringIO()
        csv.writer(buf).writerow(CSV_FIELDS)
        yield buf.getvalue()
    last = 0
    while True:
        with db.transaction() as s:
            rows = [event_dict(e) for e in s.execute(query.where(AuditEvent.id > last).limit(batch)).scalars()]
        if not rows:
            return
        last = rows[-1]["id"]
        if fmt == "jsonl":
            yield "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
        else:
            buf = io.StringIO()
            w = csv.writer(buf)
            for r in rows:
                w.writerow(
                    [json.dumps(r["payload"], separators=(",", ":")) if f == "payload" else r[f] for f in CSV_FIELDS]
                )
            yield buf.getvalue()

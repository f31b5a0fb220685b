"""Request ids, JSON access logs and per-route metrics, as one pure ASGI middleware."""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import logging.handlers
import os
import queue
import sys
import time

from .. import metrics

log = logging.getLogger("preflight.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any ``extra`` fields."""

    RESERVED = set(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in self.RESERVED and not k.startswith("_")})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _LocalQueueHandler(logging.handlers.QueueHandler):
    """Hands each record as it is to the listener thread, which formats it. (The stdlib's ``prepare`` formats and
    copies every record in the calling thread, which a queue inside one process does not need.)"""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


def configure_logging(level: str = "INFO") -> None:
    """JSON lines on stderr, written by a background thread (logging.handlers.QueueListener) so a request never
    waits on the terminal or the log collector."""
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(JsonFormatter())
    q: queue.SimpleQueue = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(q, stream, respect_handler_level=False)
    listener.start()
    atexit.register(listener.stop)
    root = logging.getLogger("preflight")
    root.handlers[:] = [_LocalQueueHandler(q)]
    root.setLevel(level)
    root.propagate = False


_ids = itertools.count(1)
_PREFIX = os.urandom(6).hex()


def new_request_id() -> str:
    """Unique per process start and request, without a system call per request."""
    return f"{_PREFIX}{next(_ids):010x}"


class Observability:
    """Adds/propagates ``X-Request-ID``, logs one JSON access line per request, records route metrics."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        rid = headers.get(b"x-request-id", b"").decode("latin-1")[:128] or new_request_id()
        scope.setdefault("state", {})["request_id"] = rid
        status = {"code": 500}
        start = time.perf_counter()

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                message.setdefault("headers", []).append((b"x-request-id", rid.encode("latin-1")))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            elapsed = time.perf_counter() - start
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            metrics.REQUESTS.labels(route, scope["method"], str(status["code"])).inc()
            metrics.LATENCY.labels(route, scope["method"]).observe(elapsed)
            log.info(
                "request",
                extra={
                    "request_id": rid,
                    "method": scope["method"],
                    "route": route,
                    "path": scope["path"],
                    "status": status["code"],
                    "duration_ms": round(elapsed * 1000, 2),
                },
            )

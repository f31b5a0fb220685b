# syntax=docker/dockerfile:1
# Multi-stage build: wheels of exactly what uv.lock pins in a builder, a slim non-root runtime with a health check.
FROM python:3.11-slim AS build
WORKDIR /src
RUN pip install --no-cache-dir uv==0.13.9
COPY pyproject.toml uv.lock README.md ./
COPY service ./service
# the service's locked dependencies (the server and postgres extras), then the project's own wheel
RUN uv export --frozen --extra server --extra postgres --no-emit-project --format requirements-txt -o requirements.txt \
 && pip wheel --no-cache-dir --wheel-dir /wheels -r requirements.txt \
 && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PREFLIGHT_DATA_DIR=/var/lib/preflight
RUN useradd --system --uid 10001 --home-dir /var/lib/preflight --create-home preflight
WORKDIR /app
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index /wheels/* && rm -rf /wheels
# the migrations run from the working directory: alembic.ini + migrations/ (service.db.migrate looks there)
COPY alembic.ini ./
COPY migrations ./migrations
USER preflight
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status == 200 else 1)"
CMD ["preflight", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2", "--no-migrate"]

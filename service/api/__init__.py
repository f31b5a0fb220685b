"""HTTP adapter (FastAPI): thin routers translating HTTP to the services and the domain core."""

# One image for the API and the GPU worker. The dashboard is built in a Node stage and copied in.
FROM node:20-slim AS frontend
WORKDIR /src/frontend
COPY frontend/package.json frontend/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY frontend/ ./
RUN npm run build

FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY backend/ backend/
COPY worker/ worker/
COPY migrations/ migrations/
# PyPI's torch wheel brings its CUDA runtime; the host needs only the NVIDIA driver and container toolkit.
RUN pip install "torch==2.13.0" && pip install .
COPY --from=frontend /src/frontend/dist frontend/dist

FROM base AS api
EXPOSE 8000
CMD ["ulab", "serve", "--host", "0.0.0.0", "--port", "8000"]

FROM base AS worker
CMD ["ulab", "worker"]

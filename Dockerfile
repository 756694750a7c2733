# One image for the API and the workers. The Python stage comes first: the dashboard's TypeScript types are
# generated from the API's OpenAPI schema, which the Node stage then builds against.
# The GPU worker (target gpu-worker, what docker-compose.yml runs) starts from a CUDA PyTorch base that ships
# flash-attn built against its torch (NVIDIA's NGC PyTorch image), so nothing builds flash-attn from source here.
ARG GPU_BASE=nvcr.io/nvidia/pytorch:25.10-py3

FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY plan/ plan/
COPY backend/ backend/
COPY worker/ worker/
COPY migrations/ migrations/
COPY examples/ examples/
# PyPI's torch wheel brings its CUDA runtime; the host needs only the NVIDIA driver and container toolkit.
# Editable install: the code stays under /app, where it finds migrations/ and frontend/dist.
RUN pip install "torch==2.13.0" && pip install -e .
RUN ulab openapi --out /app/openapi.json

FROM node:20-slim AS frontend
WORKDIR /src/frontend
COPY frontend/package.json frontend/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY frontend/ ./
# the planner bundles examples/tiny-llama-sp2.json (imported from ../examples)
COPY examples/ ../examples/
COPY --from=base /app/openapi.json ./openapi.json
RUN npm run build

FROM base AS api
COPY --from=frontend /src/frontend/dist frontend/dist
EXPOSE 8000
CMD ["ulab", "serve", "--host", "0.0.0.0", "--port", "8000"]

FROM base AS worker
CMD ["ulab", "worker"]

FROM ${GPU_BASE} AS gpu-worker
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY plan/ plan/
COPY backend/ backend/
COPY worker/ worker/
COPY migrations/ migrations/
COPY examples/ examples/
COPY bench/ bench/
COPY scripts/ scripts/
# Keep the base's torch, Triton and flash-attn (pip may not replace them: constraints at their installed versions).
# The base's Python may be newer than requires-python names: the code is tested on 3.11 and run from the tree.
# DeepSpeed is a source distribution: built against that torch (no build isolation), with its CPU Adam op
# compiled now (DS_BUILD_CPU_ADAM=1) rather than on a worker's first offloaded run. liger-kernel: the gpu extra.
RUN pip list --format=freeze | grep -iE '^(torch|triton|flash[-_]attn|pytorch-triton)==' > /tmp/base-constraints.txt && \
    DS_BUILD_CPU_ADAM=1 pip install --no-build-isolation --ignore-requires-python \
        -c /tmp/base-constraints.txt -e '.[gpu,trackers]'
# the image is only good if the GPU paths import: flash-attn (from the base), Liger, and DeepSpeed's CPU Adam
RUN python -c "import flash_attn, liger_kernel; from deepspeed.ops.op_builder import CPUAdamBuilder; \
CPUAdamBuilder().load(); print('flash_attn', flash_attn.__version__)"
CMD ["ulab", "worker"]

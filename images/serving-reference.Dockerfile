# syntax=docker/dockerfile:1
#
# HorizonServe reference serving image: the reference multi-process stage pipeline
# (`horizonserve serve`, PyTorch; no vLLM), plus `horizonserve calibrate` and `sidecar`.
#   localhost/horizonserve-serving-reference:<version>   (images/build.sh)
#
#   docker build -f images/serving-reference.Dockerfile -t horizonserve-serving-reference .
#
# Build context: the repository root (pyproject.toml, README.md, runtime/, operator/).
# Base: any Debian/Ubuntu-like image with python3.11+, `python -m venv` and groupadd/useradd;
# images/build.sh passes its mmdebstrap-built Debian bookworm base.
#
# torch: TORCH_SPEC from TORCH_PIP_ARGS. The default is PyTorch's CPU wheel index (the CPU
# build of torch 2.13.0, the release vLLM 0.30.0 pins). images/build.sh installs the local CPU
# wheel instead (TORCH_PIP_ARGS=--find-links /wheels, bind-mounted). For a CUDA image pass
# TORCH_PIP_ARGS="" (PyPI's CUDA build) and run it with the NVIDIA container toolkit.
#
# Run (CPU, tiny random-weight models, HTTP API on :8000):
#   podman run --rm -p 8000:8000 horizonserve-serving-reference
#   curl -s localhost:8000/v1/requests -d '{"priority": 0, "output_tokens": 4}'

ARG BASE_IMAGE=python:3.11-slim-bookworm

# deps: torch and the project's dependencies in /opt/venv, from pyproject.toml alone, so a
# change in the sources reuses this stage and its copy below; a .pth file puts
# /opt/horizonserve (the project) on the venv's path.
FROM ${BASE_IMAGE} AS deps
# A CA bundle for pip behind a TLS-intercepting proxy (empty: pip's own); see operator/Dockerfile.
ARG PIP_CERT=""
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple"

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# torch first: the largest layer, and it changes only with TORCH_SPEC.
RUN pip install --upgrade pip && pip install ${TORCH_PIP_ARGS} "${TORCH_SPEC}"

WORKDIR /src
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && python -c "import pathlib, site; pathlib.Path(site.getsitepackages()[0], 'horizonserve.pth').write_text('/opt/horizonserve\n')"

# build: the project alone in /opt/horizonserve.
FROM deps AS build
ARG PIP_CERT=""
COPY README.md ./
COPY runtime/ runtime/
COPY operator/ operator/
RUN pip install --no-deps . --no-compile --target /opt/horizonserve \
    && python -m compileall -q /opt/horizonserve \
    && python -c "import torch, horizonserve.runtime.engine.reference.pipeline" \
    && /opt/horizonserve/bin/horizonserve --version

FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.title="horizonserve-serving-reference" \
      org.opencontainers.image.description="HorizonServe reference stage pipeline (horizonserve serve), PyTorch" \
      org.opencontainers.image.source="https://github.com/horizonserve/horizonserve" \
      org.opencontainers.image.licenses="Apache-2.0"

RUN groupadd --system --gid 65532 horizonserve \
    && useradd --system --uid 65532 --gid 65532 --home-dir /home/horizonserve --create-home \
        --shell /usr/sbin/nologin horizonserve

COPY --from=deps /opt/venv /opt/venv
COPY --from=build /opt/horizonserve /opt/horizonserve

ENV PATH=/opt/horizonserve/bin:/opt/venv/bin:$PATH \
    HOME=/home/horizonserve \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib

USER 65532:65532
WORKDIR /home/horizonserve

EXPOSE 8000

# No ENTRYPOINT: the operator (or `podman run IMAGE horizonserve ...`) gives the whole command.
CMD ["horizonserve", "serve", "--preset", "tiny", "--device", "cpu", "--host", "0.0.0.0", "--port", "8000"]

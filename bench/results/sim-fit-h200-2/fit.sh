#!/bin/sh
# The three fits on the 30-sample calibration, chained (each writes the artifact with its
# pipeline refitted, the others as given). CPU, repository root, the repo's .venv.
set -e
F=bench/results/sim-fit-h200-2
H=bench/results/h200-eval
T="text-text,audio-text,image-text,video-text,summarize-text"
horizonserve calibrate fit --records $H/qwen-v5 --base $F/base.json \
    --engine reference --step-constants --fit-points r4,r8 --holdout-points r6,r10 \
    --factors down_mps,shared_full,shared_prefill --solo-weight 0.05 --solo-classes $T \
    --out $F/step1-qwen.json > $F/fit-qwen.log 2>&1
horizonserve calibrate fit --records $H/mimo-r8-v1 --base $F/step1-qwen.json \
    --engine reference --step-constants --fit-points r8 \
    --factors down_mps,shared_full,shared_prefill --solo-weight 0.05 --solo-classes text-text,audio-text \
    --out $F/step2-mimo.json > $F/fit-mimo.log 2>&1
horizonserve calibrate fit --records $H/bagel-v3 --base $F/step2-mimo.json \
    --engine reference --step-constants --fit-points r2 --holdout-points r1,r3,r2-l60 \
    --factors down_partition,down_mps,down_timeslice,shared_partition,shared_full,shared_mps \
    --out $F/h200-fitted-r2.json > $F/fit-bagel-r2.log 2>&1

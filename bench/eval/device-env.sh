# Source at the start of every device call (the preamble the campaigns' COMMAND.txt files
# spell out): installs the carried wheels (bench/eval/device-wheels.sh) under /tmp/site, maps
# runtime/ to the import name horizonserve.runtime without installing the project, and puts
# NVIDIA's tools on PATH. Sets E to the campaigns' folder.
#
#   source bench/eval/device-env.sh && python3 bench/eval/campaign.py run --plan $E/... --out $OUT/...
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl-engine/*.whl || return 1
mkdir -p /tmp/hs/horizonserve && ln -sfn "$PWD/runtime" /tmp/hs/horizonserve/runtime || return 1
export PYTHONPATH=/tmp/hs:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PATH=$PATH:/usr/local/nvidia/bin PYTHONUNBUFFERED=1
E=bench/results/h200-eval

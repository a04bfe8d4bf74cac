"""HorizonServe as a vLLM-Omni plugin (install extra `vllm-omni`).

Entry point `register()` (module `plugin`) is listed in the `vllm.general_plugins` and
`vllm_omni.general_plugins` groups; it does nothing unless HorizonServe is switched on
(`HORIZONSERVE_VLLM=1` or `HORIZONSERVE_SERVING_CONFIG` set). See README.md beside this file.

Nothing here imports vLLM at import time: the modules that need it (`scheduler`, `worker`,
`api`, `pipelines`) import it inside functions or are imported only by vLLM itself.
"""

from __future__ import annotations

"""Stage backends: `reference` (a real multi-process torch pipeline) and `vllm_omni` (plugin)."""

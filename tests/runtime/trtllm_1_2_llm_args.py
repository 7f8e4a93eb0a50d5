"""LLM API argument fields of TensorRT-LLM 1.2.x that the runtime may write into
trtllm-serve's --extra_llm_api_options file (extracted data, not their code).

Source: tensorrt_llm/llmapi/llm_args.py in NVIDIA/TensorRT-LLM, read with the search
tools of this workplace. The v1.2.1 tag itself cannot be checked out here (the
repository is over the fetch limit); the stored version read is the one whose
TorchLlmArgs has `sampler_type`, DSA sparse attention and MoE backend CUTEDSL (the
1.1/1.2 line, index id 1090804222). Every fact used below also holds in an earlier
stored version (index id 1520735490: `enable_iter_perf_stats` on TorchLlmArgs,
`validate_kv_cache_dtype` on TrtLlmArgs) and a later one (index id 7019226376:
`return_perf_metrics` on BaseLlmArgs), so it holds in 1.2.1 between them.

Facts:
- `class StrictBaseModel(BaseModel)` sets `extra = "forbid"`; BaseLlmArgs, KvCacheConfig
  derive from it (BaseLlmArgs also sets model_config "extra": "forbid"): an unknown key
  is a validation error, and trtllm-serve exits.
- `enable_iter_perf_stats`, `enable_iter_req_stats`, `print_iter_log`,
  `perf_metrics_max_requests` are fields of `TorchLlmArgs` only.
- `TrtLlmArgs.validate_kv_cache_dtype`: `assert self.kv_cache_config.dtype == "auto",
  "KvCacheConfig.dtype is not supported by the TensorRT backend."`
- `TorchLlmArgs.sync_quant_config_with_kv_cache_config_dtype`: dtype "auto" -> as the
  checkpoint says, "fp8" -> `QuantAlgo.FP8`, anything else only logs a warning.
- `BaseLlmArgs.lora_config: Optional[LoraConfig]` (next to `enable_lora`, which the PyTorch
  backend ignores when lora_config is given: validate_lora_config_consistency). LoraConfig is the
  dataclass of tensorrt_llm/lora_helper.py (index id 53470212518): lora_dir, lora_ckpt_source ("hf"
  default), max_lora_rank (default 64), lora_target_modules, trtllm_modules_to_hf_modules,
  max_loras, max_cpu_loras, swap_gate_up_proj. On the PyTorch backend, a lora_dir of other than
  exactly one directory needs lora_target_modules (tensorrt_llm/_torch/pyexecutor/_util.py:
  `assert len(lora_config.lora_target_modules) >= 1, "Expecting at least one lora target module"`),
  and trtllm_modules_to_hf_modules then defaults to get_default_trtllm_modules_to_hf_modules().
  trtllm-serve passes each request's `lora_request` to `generate_async(..., lora_request=...)`
  (tensorrt_llm/serve/openai_server.py).
Only fields the runtime may use are listed; a key the runtime emits that is missing
here fails the test, which is the point.
"""

SOURCE = "tensorrt_llm/llmapi/llm_args.py"

BASE_LLM_ARGS = frozenset({
    "model", "tokenizer", "max_batch_size", "max_num_tokens", "max_seq_len", "max_input_len", "max_beam_width",
    "kv_cache_config", "enable_chunked_prefill", "iter_stats_max_iterations", "request_stats_max_iterations",
    "return_perf_metrics", "num_postprocess_workers", "trust_remote_code", "revision", "dtype",
    "tensor_parallel_size", "pipeline_parallel_size", "scheduler_config", "enable_lora", "lora_config",
})
TRT_LLM_ARGS = BASE_LLM_ARGS | frozenset({
    "enable_tqdm", "workspace", "enable_build_cache", "extended_runtime_perf_knob_config", "calib_config",
    "quant_config", "embedding_parallel_mode", "fast_build", "build_config", "batching_type", "normalize_log_probs",
})
TORCH_LLM_ARGS = BASE_LLM_ARGS | frozenset({
    "cuda_graph_config", "disable_overlap_scheduler", "attn_backend", "sampler_type", "enable_iter_perf_stats",
    "enable_iter_req_stats", "print_iter_log", "perf_metrics_max_requests", "torch_compile_config",
    "enable_autotuner", "stream_interval", "checkpoint_format",
})
ARGS_BY_BACKEND = {"tensorrt": TRT_LLM_ARGS, "pytorch": TORCH_LLM_ARGS}

KV_CACHE_CONFIG = frozenset({
    "enable_block_reuse", "max_tokens", "max_attention_window", "sink_token_length", "free_gpu_memory_fraction",
    "host_cache_size", "onboard_blocks", "cross_kv_cache_fraction", "secondary_offload_min_priority",
    "event_buffer_max_size", "enable_partial_reuse", "copy_on_partial_reuse", "use_uvm", "max_gpu_total_bytes",
    "dtype", "mamba_ssm_cache_dtype", "tokens_per_block",
})
LORA_CONFIG = frozenset({
    "lora_dir", "lora_ckpt_source", "max_lora_rank", "lora_target_modules", "trtllm_modules_to_hf_modules",
    "max_loras", "max_cpu_loras", "swap_gate_up_proj",
})
LORA_HELPER_SOURCE = "tensorrt_llm/lora_helper.py"
NESTED = {"kv_cache_config": KV_CACHE_CONFIG, "lora_config": LORA_CONFIG}

# kv_cache_config.dtype values each backend's validators accept and act on.
KV_CACHE_DTYPE_BY_BACKEND = {"tensorrt": frozenset({"auto"}), "pytorch": frozenset({"auto", "fp8"})}

# Fields trtllm-serve itself reads from the args object when an option is on, so the option is only safe
# where the backend's args class has them. tensorrt_llm/serve/openai_server.py, OpenAIServer's LLM set-up
# (stored versions index id 456200087, the 1.1 line with `self.llm`, and 36409600292, a later one with
# `self.generator`): `if ...args.return_perf_metrics:` ... `max_perf_metrics = ...args.perf_metrics_max_requests`.
# perf_metrics_max_requests is a TorchLlmArgs field in 1.1/1.2 (above), so on the TensorRT backend
# trtllm-serve dies at startup with AttributeError: NVIDIA/TensorRT-LLM issue #9678 (release:1.2.0rc2);
# PR #10662 (merged January 2026) moves the field to BaseLlmArgs, and whether 1.2.1 carries it is not known,
# so the check assumes it does not.
SERVER_READS_WHEN_SET = {"return_perf_metrics": ("perf_metrics_max_requests",)}
OPENAI_SERVER_SOURCE = "tensorrt_llm/serve/openai_server.py"

"""Option names and choices of the TensorRT-LLM 1.2.x tools the runtime drives (extracted data, not their code).

Read from the NVIDIA/TensorRT-LLM sources with the search tools of this workplace
(the full repository, 2.5 GB, is over the fetch limit, so the v1.2.1 tag itself could
not be checked out; the stored file versions below are the ones that could be read):

  examples/models/core/gpt/convert_checkpoint.py  @ cb4c622cf5bb97009451f7f44609498a48a2b11d
      and @ 7edbcccb7f6baa8375008e1f2978067873e7cf14 (adds the early-2026 engine-flow
      deprecation warning; parse_arguments() is identical in both, so it is the same
      in the 1.2.1 release that lies between them)
  tensorrt_llm/commands/build.py (trtllm-build)   @ 65f1d1536e18aea3380e6e270e00895a709333eb
  tensorrt_llm/plugin/plugin.py (plugin options)  @ c20322ffd3dc0740ca530c9fad989b22e64f6e06
  examples/quantization/quantize.py               @ 059c97c10c12e948e91676c8db3c9f137b0a2389
  tensorrt_llm/commands/serve.py (trtllm-serve)   @ 00209af149e7774406881a37283dce303571eb11

Each option: kind "value" (takes one argument), "flag" (store_true / click is_flag) or
"optional" (nargs='?'); `type` int/float/str; `choices` when the tool restricts them.
Only options relevant to this project are listed for the big tools; an option the
runtime emits that is missing here fails the test, which is the point.
"""

CONVERT_CHECKPOINT_GPT = {
    "--model_dir": {"kind": "value", "type": "str"},
    "--nemo_ckpt_path": {"kind": "value", "type": "str"},
    "--gpt_variant": {"kind": "value", "type": "str",
                      "choices": ["gpt2", "santacoder", "starcoder", "starcoder2", "persimmon", "kosmos-2", "nemotron"]},
    "--tp_size": {"kind": "value", "type": "int"},
    "--pp_size": {"kind": "value", "type": "int"},
    "--dtype": {"kind": "value", "type": "str", "choices": ["auto", "float16", "bfloat16", "float32"]},
    "--load_model_on_cpu": {"kind": "flag"},
    "--use_parallel_embedding": {"kind": "flag"},
    "--embedding_sharding_dim": {"kind": "value", "type": "int", "choices": [0, 1]},
    "--use_weight_only": {"kind": "flag"},
    "--weight_only_precision": {"kind": "optional", "type": "str", "choices": ["int8", "int4"]},
    "--calib_dataset": {"kind": "value", "type": "str"},
    "--int8_kv_cache": {"kind": "flag"},
    "--per_channel": {"kind": "flag"},
    "--per_token": {"kind": "flag"},
    "--smoothquant": {"kind": "value", "type": "float", "aliases": ["-sq"]},
    "--dataset_cache_dir": {"kind": "value", "type": "str"},
    "--output_dir": {"kind": "value", "type": "str"},
    "--workers": {"kind": "value", "type": "int"},
    "--log_level": {"kind": "value", "type": "str"},
}

QUANTIZE = {
    "--model_dir": {"kind": "value", "type": "str"},
    "--nemo_ckpt_path": {"kind": "value", "type": "str"},
    "--decoder_type": {"kind": "value", "type": "str", "choices": ["gptnext", "llama"]},
    "--device": {"kind": "value", "type": "str", "choices": ["cuda", "cpu"]},
    "--device_map": {"kind": "value", "type": "str", "choices": ["auto", "sequential", "cpu", "gpu"]},
    "--calib_dataset": {"kind": "value", "type": "str"},
    "--calib_tp_size": {"kind": "value", "type": "int"},
    "--calib_pp_size": {"kind": "value", "type": "int"},
    "--dtype": {"kind": "value", "type": "str", "choices": ["auto", "float16", "bfloat16", "float32"]},
    "--qformat": {"kind": "value", "type": "str",
                  "choices": ["nvfp4", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "full_prec"]},
    "--seed": {"kind": "value", "type": "int"},
    "--tokenizer_max_seq_length": {"kind": "value", "type": "int"},
    "--batch_size": {"kind": "value", "type": "int"},
    "--calib_size": {"kind": "value", "type": "int"},
    "--calib_max_seq_length": {"kind": "value", "type": "int"},
    "--output_dir": {"kind": "value", "type": "str"},
    "--tp_size": {"kind": "value", "type": "int"},
    "--pp_size": {"kind": "value", "type": "int"},
    "--cp_size": {"kind": "value", "type": "int"},
    "--awq_block_size": {"kind": "value", "type": "int"},
    "--kv_cache_dtype": {"kind": "value", "type": "str", "choices": ["int8", "fp8"]},
    "--quantize_lm_head": {"kind": "flag"},
    "--export_format": {"kind": "value", "type": "str", "choices": ["tensorrt_llm", "hf"]},
}

_PLUGIN_DTYPES = ["auto", "float16", "float32", "bfloat16", "int32", "disable"]
_ENABLE = ["enable", "disable"]

TRTLLM_BUILD = {
    "--checkpoint_dir": {"kind": "value", "type": "str"},
    "--model_config": {"kind": "value", "type": "str"},
    "--build_config": {"kind": "value", "type": "str"},
    "--model_cls_file": {"kind": "value", "type": "str"},
    "--model_cls_name": {"kind": "value", "type": "str"},
    "--output_dir": {"kind": "value", "type": "str"},
    "--max_batch_size": {"kind": "value", "type": "int"},
    "--max_input_len": {"kind": "value", "type": "int"},
    "--max_seq_len": {"kind": "value", "type": "int", "aliases": ["--max_decoder_seq_len"]},
    "--max_beam_width": {"kind": "value", "type": "int"},
    "--max_num_tokens": {"kind": "value", "type": "int"},
    "--opt_num_tokens": {"kind": "value", "type": "int"},
    "--max_encoder_input_len": {"kind": "value", "type": "int"},
    "--max_prompt_embedding_table_size": {"kind": "value", "type": "int", "aliases": ["--max_multimodal_len"]},
    "--kv_cache_type": {"kind": "value", "type": "str", "choices": ["continuous", "paged", "disabled"]},
    "--input_timing_cache": {"kind": "value", "type": "str"},
    "--output_timing_cache": {"kind": "value", "type": "str"},
    "--profiling_verbosity": {"kind": "value", "type": "str", "choices": ["layer_names_only", "detailed", "none"]},
    "--strip_plan": {"kind": "flag"},
    "--weight_sparsity": {"kind": "flag"},
    "--weight_streaming": {"kind": "flag"},
    "--fast_build": {"kind": "flag"},
    "--workers": {"kind": "value", "type": "int"},
    "--log_level": {"kind": "value", "type": "str"},
    "--enable_debug_output": {"kind": "flag"},
    "--dry_run": {"kind": "flag"},
    "--monitor_memory": {"kind": "flag"},
    "--logits_dtype": {"kind": "value", "type": "str", "choices": ["float16", "float32"]},
    "--gather_context_logits": {"kind": "flag"},
    "--gather_generation_logits": {"kind": "flag"},
    "--gather_all_token_logits": {"kind": "flag"},
    "--max_draft_len": {"kind": "value", "type": "int"},
    # add_plugin_argument(): Optional[Literal[...]] plugins take their dtype choices (None -> "disable"),
    # bool features take enable/disable.
    "--bert_attention_plugin": {"kind": "value", "type": "str", "choices": _PLUGIN_DTYPES},
    "--gpt_attention_plugin": {"kind": "value", "type": "str", "choices": _PLUGIN_DTYPES},
    "--gemm_plugin": {"kind": "value", "type": "str",
                      "choices": ["auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"]},
    "--gemm_swiglu_plugin": {"kind": "value", "type": "str", "choices": ["fp8", "disable"]},
    "--fp8_rowwise_gemm_plugin": {"kind": "value", "type": "str", "choices": _PLUGIN_DTYPES},
    "--nccl_plugin": {"kind": "value", "type": "str", "choices": _PLUGIN_DTYPES},
    "--low_latency_gemm_plugin": {"kind": "value", "type": "str", "choices": ["fp8", "disable"]},
    "--context_fmha": {"kind": "value", "type": "str", "choices": _ENABLE},
    "--remove_input_padding": {"kind": "value", "type": "str", "choices": _ENABLE},
    "--tokens_per_block": {"kind": "value", "type": "int"},
    "--use_paged_context_fmha": {"kind": "value", "type": "str", "choices": _ENABLE},
    "--use_fp8_context_fmha": {"kind": "value", "type": "str", "choices": _ENABLE},
    "--multiple_profiles": {"kind": "value", "type": "str", "choices": _ENABLE},
    "--reduce_fusion": {"kind": "value", "type": "str", "choices": _ENABLE},
    "--use_fused_mlp": {"kind": "value", "type": "str", "choices": _ENABLE},
}

# trtllm-serve is a click command: `trtllm-serve MODEL [OPTIONS]`.
TRTLLM_SERVE_POSITIONAL = ["model"]
TRTLLM_SERVE = {
    "--tokenizer": {"kind": "value", "type": "str"},
    "--custom_tokenizer": {"kind": "value", "type": "str"},
    "--host": {"kind": "value", "type": "str"},
    "--port": {"kind": "value", "type": "int"},
    "--backend": {"kind": "value", "type": "str", "choices": ["pytorch", "tensorrt", "_autodeploy", "trt"]},
    "--log_level": {"kind": "value", "type": "str",
                    "choices": ["internal_error", "error", "warning", "info", "verbose", "debug", "trace"]},
    "--max_beam_width": {"kind": "value", "type": "int"},
    "--max_batch_size": {"kind": "value", "type": "int"},
    "--max_num_tokens": {"kind": "value", "type": "int"},
    "--max_seq_len": {"kind": "value", "type": "int"},
    "--tensor_parallel_size": {"kind": "value", "type": "int", "aliases": ["--tp_size"]},
    "--pipeline_parallel_size": {"kind": "value", "type": "int", "aliases": ["--pp_size"]},
    "--gpus_per_node": {"kind": "value", "type": "int"},
    "--free_gpu_memory_fraction": {"kind": "value", "type": "float", "aliases": ["--kv_cache_free_gpu_memory_fraction"]},
    "--num_postprocess_workers": {"kind": "value", "type": "int"},
    "--trust_remote_code": {"kind": "flag"},
    "--revision": {"kind": "value", "type": "str"},
    "--config": {"kind": "value", "type": "str", "aliases": ["--extra_llm_api_options"]},
    "--fail_fast_on_attention_window_too_large": {"kind": "flag"},
    "--enable_chunked_prefill": {"kind": "flag"},
}

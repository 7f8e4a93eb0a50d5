"""What TensorRT-LLM 1.2.x runs before it serves (extracted facts, not their code).

Read from NVIDIA/TensorRT-LLM with the search tools of this workplace, tensorrt_llm/_torch/pyexecutor/model_engine.py
(the PyTorch backend's PyTorchModelEngine), stored index ids 707893322 (an earlier 1.x version) and 3514536498 (a
later one, with `llm_args`): the same warm-up in both, so in the 1.2 line between them.

- `warmup` runs `_run_torch_compile_warmup`, `_run_autotuner_warmup` and `_run_cuda_graph_warmup`, in that order.
- `_general_warmup` (torch.compile's) runs one forward for each of (num_tokens, num_gen_tokens) in
  {(1, 1) "Specialize for 1 token", (max_batch_size, max_batch_size) "pure generation", (2, 0) "Non-one, pure
  context", (curr_max_num_tokens, 0) "max_num_tokens, pure context"}, where curr_max_num_tokens is the least of
  the KV cache's free tokens, max_num_tokens and batch_size x (max_seq_len - 1).
- `_run_autotuner_warmup` runs one forward of a curr_max_num_tokens context batch under `autotune()`, which times
  each candidate kernel (tactic) of the tunable ops and keeps the fastest in its cache.
- `_capture_generation_cuda_graphs` captures a generation CUDA graph for every batch size of
  `_cuda_graph_batch_sizes` up to the engine's batch size, largest first ("so smaller graphs can reuse memory
  from larger ones").
- `_capture_piecewise_cuda_graphs` ends with a context forward per captured token count "with most requests",
  "to make sure that large enough blocks are allocated and can be correctly reused" (the caching allocator).

So the engine warms both ends of a forward's token count and the largest batch before it serves. Its context
kernels run on packed tokens (one [num_tokens, hidden] activation for the whole batch), so a token count is its
shape; the reference engine pads each row ([rows, tokens]), so its analogue is each batch bucket of rows at each
padded length (runtime/reference/engine.py, Engine.warmup_shapes).
"""

SOURCE = "tensorrt_llm/_torch/pyexecutor/model_engine.py PyTorchModelEngine.warmup, _general_warmup"
# (num_tokens, num_gen_tokens) of _general_warmup, by what they stand for.
GENERAL_WARMUP = ("one token", "max batch of generation", "two tokens of context", "max_num_tokens of context")
WARMS_THE_LARGEST_CONTEXT_BATCH = True
CUDA_GRAPHS_PER_BATCH_SIZE_LARGEST_FIRST = True

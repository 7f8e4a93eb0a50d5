"""How TensorRT-LLM 1.2.x runs the context (prefill) requests of one iteration (extracted facts, not their code).

Read from NVIDIA/TensorRT-LLM with the search tools of this workplace (the repository is over the fetch limit, so
the v1.2.1 tag itself could not be checked out). Each fact holds in stored versions from before 1.2.1 and after it
(the scheduler's in index ids 653260947, 48018004401, 51838119563 and 36884210968, the last with the 2026
agent-tree resort policy), so it holds in 1.2.1 between them:

- cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp, `MicroBatchScheduler::operator()`: one pass over the
  active requests in their order; without context chunking a context request counts its tokens and
  `if (maxNumTokensRuntime && batchNumTokens + reqNumTokens > maxNumTokensRuntime.value()) break;` -- the first
  request that does not fit ends the iteration's selection: no later, shorter request is taken past it, and
  nothing is reordered by length. Every selected context request goes into the iteration's one batch
  (`contextRequests`), beside the generation requests.
- The PyTorch backend schedules with the same C++ scheduler: tensorrt_llm/_torch/pyexecutor/scheduler.py,
  `BindMicroBatchScheduler` ("to be aligned with MicroBatchScheduler::scheduleRequests") wraps
  `tb_internal.algorithms.MicroBatchScheduler(ctx_chunk_config, max_num_tokens)` (index ids 9623129673,
  53114936203).
- A context request's KV blocks become reusable from the next iteration: the TensorRT backend's
  cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.h, `storeContextBlocks` ("Store full kv cache blocks
  contributed by req. These blocks become reusable from next step.", index id 118271910); the PyTorch backend's
  tensorrt_llm/_torch/pyexecutor/resource_manager.py, `KVCacheManager.update_resources`, which runs after the
  forward and calls `self.impl.store_context_blocks(request)` for each of `scheduled_batch.context_requests`
  (index ids 77926604, 3501434665). Two requests of one iteration with a common new prefix therefore both
  compute it.
"""

SCHEDULER_SOURCE = "cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp MicroBatchScheduler::operator()"
STORE_SOURCE = ("cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.h storeContextBlocks; "
                "tensorrt_llm/_torch/pyexecutor/resource_manager.py KVCacheManager.update_resources")

CONTEXT_REQUESTS_OF_AN_ITERATION_RUN_IN_ONE_BATCH = True
# Selection by max_num_tokens keeps the requests' order and stops at the first that does not fit.
CONTEXT_SELECTION_KEEPS_ORDER = True
# Blocks a context request computed are found by requests of later iterations only.
BLOCKS_REUSABLE_FROM_THE_NEXT_ITERATION = True

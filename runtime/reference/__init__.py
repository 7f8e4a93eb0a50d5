"""Reference backend: a compact PyTorch GPT-2-family server with trtllm-serve's OpenAI surface.

TensorRT-LLM cannot be installed on development or CI machines, so the runtime's engine cache,
serving, health, metrics and drain paths run against this backend instead. It owns:

  configs    - the model shapes (tiny for CPU tests, gpt2..gpt2-xl for the GPU)
  tokenizer  - a byte-level tokenizer written as a Hugging Face tokenizer.json (no hub access)
  build      - "building" an artifact: deterministic random weights + config + tokenizer files
  model      - the GPT-2 forward pass (naive full recompute and static-KV-cache prefill/decode)
  engine     - iteration-level batching scheduler with CUDA-graph decode steps
  server     - the aiohttp OpenAI-compatible server (/v1/completions, /health, /metrics, drain)

torch is optional: configs, tokenizer and the server module import without it; building or
serving without torch fails with one clear message.
"""

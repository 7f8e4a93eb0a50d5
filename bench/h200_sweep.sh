#!/usr/bin/env bash
# The H200 reference-backend dataset, in one device call:
#   build the GPT-2 XL-shaped artifact on the GPU, serve it with the reference backend,
#   run `fleetcast bench` over the concurrency sweep and the seed's traffic mix.
# Run from the repo root on the device machine, with the carried wheels in .whl/
# (pydantic, pydantic_core, annotated_types, typing_inspection, ruamel.yaml).
set -euo pipefail
OUT=${OUT:-/tmp/fleetcast-h200}
N=${N:-160}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m runtime.reference.build --out /tmp/xl --size gpt2-xl --device cuda
python3 -m runtime.reference.server --artifact /tmp/xl --device cuda --host 127.0.0.1 --port 8001 \
  > "$OUT/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf http://127.0.0.1:8001/health >/dev/null && break
  sleep 1
done
labels=(--label backend=reference --label gpu=H200 --label model=gpt2-xl-shape --label precision=fp16
        --label "notes=reference backend (PyTorch, random weights) on one H200: pipeline validation data, not an AWS candidate")
python3 -m scripts.cli bench run --endpoint http://127.0.0.1:8001 --concurrency 1,2,4,8,16,32,64 \
  --requests-per-level "$N" --input-tokens 128 --output-tokens 128 --tokenizer /tmp/xl --warmup 8 \
  --slo-ttft-ms 300 --slo-itl-ms 40 "${labels[@]}" --out "$OUT/h200-reference-sweep.json" \
  --report /tmp/report --quiet
cp /tmp/report/*.html "$OUT/" 2>/dev/null || true
python3 -m scripts.cli bench run --endpoint http://127.0.0.1:8001 --mix '1-16:0.8,32:0.15,64:0.05' \
  --duration 30 --input-tokens 128 --output-tokens 128 --tokenizer /tmp/xl \
  --slo-ttft-ms 300 --slo-itl-ms 40 "${labels[@]}" --out "$OUT/h200-reference-mix.json" --quiet

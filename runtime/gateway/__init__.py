"""The consumer gateway: identity (PROXY v2 + VPC endpoint), per-consumer limits and token metering.

Runs on each instance in front of trtllm-serve: `python -m runtime.gateway --help`.
Importable without CDK or TensorRT-LLM; needs only the standard library,
fleetcast.config (pydantic) and boto3 for its two AWS reads.
"""

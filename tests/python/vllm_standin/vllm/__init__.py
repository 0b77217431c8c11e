"""A stand-in for vLLM 0.33.0, tests only: the names kvtier.vllm imports, with vLLM's
signatures and meanings (as read from the 0.33.0 wheel), so the tier is tested where vLLM is
not installed. Written for kvtier; it holds no vLLM code. tests/vllm runs the real one."""
__version__ = "0.33.0"

"""A stand-in for a package of vLLM 0.33.0 (tests only)."""

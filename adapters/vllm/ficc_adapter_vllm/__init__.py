"""The FICC Inference engine adapter for vLLM."""

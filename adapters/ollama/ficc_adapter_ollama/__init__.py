"""The FICC Inference engine adapter for Ollama."""

"""The FICC Inference engine adapter for llama.cpp's `llama-server`."""

"""A ``llama-server`` compatible command running llama.cpp's C++ server from xllamacpp."""

__version__ = "0.1.0"

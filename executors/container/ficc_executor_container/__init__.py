"""The FICC Inference executor provider that runs engines as containers."""

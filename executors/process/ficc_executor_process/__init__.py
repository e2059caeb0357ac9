"""The FICC Inference executor provider that runs engines as host processes."""

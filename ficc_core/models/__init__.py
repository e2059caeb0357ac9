"""The model registry: manifests, blobs, acquisition, uploads, hub previews."""

"""Leaf utilities: the modules every layer may import, which import nothing else of FICC.

- :mod:`~ficc_core.base.errors`: the error classes and their stable codes.
- :mod:`~ficc_core.base.strictjson`: the one strict JSON decoder and encoder.
- :mod:`~ficc_core.base.digests`: sha256 of files, durable renames, directory trees of blobs.

Inside the folder only ``errors`` is below the others (an import-linter contract keeps
it so), and no module here imports anything of ``ficc_core`` from outside the folder.
"""

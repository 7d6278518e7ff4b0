"""The TLA+ specs and model-checking configs, shipped as package data (``kvgrant.specs``).

Nothing to import here: :func:`kvgrant.specfiles.specs_dir` gives the folder.
"""

"""The engines' old path to ``monsoon/shared_memory.py`` (it moved below
``problems/``, which uses it too), kept for branches written against it."""
from ..shared_memory import SharedArrays, shm_dir  # noqa: F401

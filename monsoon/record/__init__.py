"""Record: what a run leaves behind, and its live progress."""
from .recorder import COLUMNS, Recorder
from .run_folder import atomic_write, read_metrics, to_json, write_run_folder

__all__ = ["Recorder", "COLUMNS", "write_run_folder", "read_metrics", "atomic_write", "to_json"]

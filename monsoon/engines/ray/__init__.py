from .engine import RayEngine, import_ray

__all__ = ["RayEngine", "import_ray"]

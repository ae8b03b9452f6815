"""``monsoon.pipeline.staged([...])``, as the README names it: the pipeline
strategy lives in ``monsoon/strategies/pipeline/``."""
from .strategies.pipeline import Pipeline, StageList, staged

__all__ = ["Pipeline", "StageList", "staged"]

"""A real Spark session for one test module, or a skip where Spark truly
cannot run here (no pyspark, no Java runtime)."""
import contextlib
import os
import shutil

import pytest


@contextlib.contextmanager
def spark_session(master: str):
    pytest.importorskip("pyspark")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("no Java runtime (the spark engine needs Java 17+)")
    from monsoon.engines.spark import start_session

    spark = start_session(master, "monsoon-tests")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


@pytest.fixture(scope="module")
def spark():
    """A local[2] session for the module's tests (import this fixture)."""
    with spark_session("local[2]") as session:
        yield session

import os

# Keep each test process from oversubscribing the 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

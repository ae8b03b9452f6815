#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU, run the GPU tests and the GPU
# benchmark against a plain PyTorch loop, and print a table last. It installs
# nothing (such a machine may have no network): it runs the checkout as it is,
# with PYTHONPATH set to it, against the torch, NumPy, SciPy, scikit-learn and
# Numba already there. Ray and pyspark are not needed. Budget: under 8 minutes.
#
#   bash bench/gpu_check.sh [--quick]      (--quick: fewer steps in the benchmark)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
quick=${1:-}

"$PY" - <<'PY' || exit 1
import torch, numpy
print(f"torch {torch.__version__}, numpy {numpy.__version__}, CUDA available: "
      f"{torch.cuda.is_available()}")
if not torch.cuda.is_available():
    raise SystemExit("bench/gpu_check.sh: no CUDA device here; run it on a machine with one")
for k in range(torch.cuda.device_count()):
    print(f"  cuda:{k}: {torch.cuda.get_device_name(k)}")
PY

status=0
echo "== tests: tests/test_gpu.py, tests/test_device_arrays.py"
if "$PY" -c "import pytest" 2>/dev/null; then
  # the project's addopts need xdist and pytest-timeout, which such a machine may lack
  timeout 300 "$PY" -m pytest -o addopts="" -p no:cacheprovider -q -rs \
    tests/test_gpu.py tests/test_device_arrays.py 2>&1 | tail -25
  tests=${PIPESTATUS[0]}
  [ "$tests" -eq 0 ] || status=1
else
  echo "pytest is not installed here: the tests did not run"
  tests=missing
  status=1
fi

echo "== benchmark: bench/gpu.py ${quick}"
MONSOON_BENCH_RESULTS="${MONSOON_BENCH_RESULTS:-$PWD/bench/results}" \
  timeout 330 "$PY" bench/gpu.py ${quick:+--quick} 2>/tmp/monsoon-gpu-bench.err | tail -25
bench=${PIPESTATUS[0]}
[ "$bench" -eq 0 ] || { status=1; tail -5 /tmp/monsoon-gpu-bench.err; }

echo "== GPU check: tests exit ${tests}, benchmark exit ${bench} (records: bench/results/gpu/)"
exit $status

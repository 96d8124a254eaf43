"""Where things are, for tests and the processes they start: the repository root (workers run
there, with it on PYTHONPATH), the test tree, the GPU workers and the benchmark scripts."""

import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
GPU_WORKERS = os.path.join(TESTS, "gpu")
BENCHMARKS = os.path.join(REPO, "benchmarks")

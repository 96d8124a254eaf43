"""Names shared by tests/jax/test_jax_cuda.py and its GPU worker (no jax here)."""

# How the worker gets a process group serving CUDA memory at world size 1.
KINDS = ["staged", "nccl"]  # Gloo staged through pinned host memory; NCCL

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"]

# transform(algorithm) on CUDA against the same updates on CPU
ALGORITHMS = [
    "gradient_allreduce",
    "bytegrad",
    "decentralized_all",
    "decentralized_shift_one",
    "low_precision_decentralized",
    "qadam",
    "async_model_average",
]


def case_names():
    names = ["init"]
    names += [f"collectives_{d}" for d in DTYPES]
    names += ["jit_donated_and_ordered", "wrong_platform_refused"]
    names += [f"transform_{a}" for a in ALGORITHMS]
    names += ["step_number_restored_state", "step_overhead", "transform_on_gpu_mesh"]
    return names

"""Names and codes shared by the NCCL test module and its GPU workers (no torch here)."""

# (name, bagua DType code)
DTYPES = [("float32", 0), ("float64", 1), ("float16", 2), ("bfloat16", 3), ("int32", 4), ("int64", 5), ("uint8", 6)]
# (name, bagua ReduceOp code)
OPS = [("sum", 0), ("prod", 1), ("min", 2), ("max", 3), ("avg", 10)]

OTHER_CASES = [
    "allreduce_user_stream",
    "allreduce_inplace",
    "allreduce_avg_divide_kernel",
    "reduce",
    "reduce_avg_divide_kernel",
    "broadcast",
    "allgather",
    "allgather_inplace",
    "gather",
    "scatter",
    "reduce_scatter_sum",
    "reduce_scatter_avg",
    "reduce_scatter_avg_divide_kernel",
    "alltoall",
    "alltoall_v",
    "send_recv",
    "barrier",
    "empty_is_noop",
    "bad_arguments",
    "many_ops_user_stream",
]


def case_names():
    names = [f"allreduce_{d}_{o}" for d, _ in DTYPES for o, _ in OPS]
    names += OTHER_CASES
    names += [f"divide_kernel_{d}" for d, _ in DTYPES]
    names += [f"scale_kernel_{d}" for d, _ in DTYPES]
    return names

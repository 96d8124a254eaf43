"""``bagua-compare``: the same model, data and algorithm trained with the torch
frontend and with the JAX frontend, side by side.

    bagua-compare --algorithm all --nproc 2 --steps 100
    python -m bagua_core.compare --algorithm qadam,low_precision_decentralized --dtype float64

``--algorithm all`` also runs the variants of
:data:`bagua_core.compare.problem.VARIANTS` (``bytegrad_error_feedback``:
ByteGrad with ``error_feedback=True``; ``local_steps_compressed``,
``local_steps_fp4`` and ``local_steps_topk``: LocalSteps with error feedback
and ``compression="minmax_uint8"``, ``"fp4_e2m1"`` and ``"topk_uint2"``;
``local_steps_streaming``: FP4 in 4 fragments whose exchanges overlap one
step, ``mixing=0.5``). It
launches ``--nproc`` processes (``bagua-run``) running
``bagua_torch.compare_worker``, then as many running
``bagua_jax.compare_worker``; each trains every algorithm in turn, from a
fresh model, optimizer and algorithm (one launch per frontend: starting the
processes costs more than training). Both start from identical weights and read
identical batches (:mod:`bagua_core.compare.problem`), in float32 or, with
``--dtype float64``, float64 (JAX with ``jax_enable_x64``). They train with
plain SGD, except QAdam, which brings its own optimizer (``QAdamOptimizer`` in
torch, ``bagua_jax.qadam`` in JAX: Adam, ``--adam-lr``, ``--warmup-steps``).
Asynchronous model average averages after every ``--async-average-every``
steps past its warm-up (``abort`` then ``resume``; its timer never fires), so
both frontends average at the same steps; with 0 its timer averages at
wall-clock times and the curves differ from run to run. Each run reports every
step's loss (mean over ranks) and time. The tool prints the losses side by
side, the largest divergence and the time per step of each, and writes
``compare.json`` and ``compare.png`` (loss curves and step times) to
``--out``.

How close the curves are: both frontends run the same C++ steps, so for equal
inputs the communicated values are bitwise equal; what differs is each
framework's own arithmetic (matmul summation order, fused operations), a few
float ulps per step. In float32 (3 processes, 50 steps) the curves agree within
1e-5 relative, except QAdam's: Adam divides by sqrt(v), tiny for some weights,
which amplifies ulp differences (plain Adam: 6e-4), and after its warm-up the
8-bit momentum (MinMaxUInt8, 255 levels between a chunk's min and max) turns a
difference that lands on a rounding boundary into a whole quantisation step,
divided by the frozen sqrt(v); those flips accumulate to a few percent (3.5%
measured). In float64
the frameworks' differences are float64 ulps, which almost never change the
float32 value the compressor quantises, and QAdam's and low-precision
decentralized's curves agree to about 1e-15.

This package imports neither torch nor jax: the frontends run in their own
processes.
"""

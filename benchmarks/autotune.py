"""Autotuned bucket plan against the default plan: training throughput, side by side.

    PYTHONPATH=$PWD python benchmarks/autotune.py [--workload mlp|decoder-first] [--nproc 2] [--json results.json]

The script is its own driver (``python -m bagua_core.run --nproc-per-node N
--no-prefix``; nothing is left behind on a timeout or Ctrl-C). Two copies of
one model (float32, ``--layers`` square Linear layers of ``--width``) train
with GradientAllReduce in the same processes, from the same weights, on the
same batches:

    default     the default bucket plan (BAGUA_BUCKET_SIZE, 10 MiB unless set,
                over the parameters in reverse registration order)
    autotuned   BAGUA_AUTOTUNE=1: first trained until the tuner settled (at most
                ``--max-tune-steps`` steps; ``--max-samples`` plans, each measured
                ``--confidence`` s after ``--warmup`` s, a decision every
                ``--interval`` steps, then ``--confirm-pairs`` alternating pairs of
                the best plan and the default), then with the plan it kept

Workloads (``--workload``):

    mlp            a plain MLP, registered in the order it runs: the default
                   order is the order backward makes the gradients
    decoder-first  an autoencoder (encoder, decoder, head) whose decoder is
                   registered before its encoder, as the attribute order of a
                   module often differs from its forward order: in reverse
                   registration order the first bucket holds the encoder's
                   gradients, which backward makes last, so no bucket is sent
                   before backward (almost) ended; the tuner buckets in the
                   observed readiness order

The kept plan is printed, with the tuner's paired verdict. When it is the
default plan (same buckets, same order) the ratio is 1 by construction and the
copies are not timed against each other. Otherwise ``--rounds`` rounds of
``--steps`` timed steps of each (between barriers, every other round in
reverse order, so both see the same load); printed: the median samples/s of
each and the median of the per-round ratios with their quartiles.

With ``--trace PATH`` a third copy, ``default traced``, trains with the
default plan and ``BAGUA_TRACE=PATH`` (files ``PATH.rank<r>.json``): its
throughput shows what tracing costs, and its trace's summary (communication
per step, share overlapped with backward) is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import _launch  # benchmarks/_launch.py: the script is its own driver
from _training import quartiles  # benchmarks/_training.py


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("mlp", "decoder-first"), default="mlp", help="the model (default mlp)")
    p.add_argument("--layers", type=int, default=16, help="square Linear layers (default 16)")
    p.add_argument("--width", type=int, default=512, help="their width (default 512)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--rounds", type=int, default=20, help="timed rounds (default 20)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per model per round (default 3)")
    p.add_argument("--max-samples", type=int, default=8, help="BAGUA_AUTOTUNE_MAX_SAMPLES (default 8)")
    p.add_argument(
        "--confidence", type=float, default=1.0, help="BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S (default 1.0)"
    )
    p.add_argument("--warmup", type=float, default=1.0, help="BAGUA_AUTOTUNE_WARMUP_TIME_S (default 1.0)")
    p.add_argument("--interval", type=int, default=10, help="BAGUA_AUTOTUNE_INTERVAL_STEPS (default 10)")
    p.add_argument("--confirm-pairs", type=int, default=5, help="BAGUA_AUTOTUNE_CONFIRM_PAIRS (default 5)")
    p.add_argument("--max-tune-steps", type=int, default=1000, help="stop tuning after this many steps")
    p.add_argument("--trace", help="also train a traced copy of the default, tracing to this path")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--nproc", type=int, default=2, help="processes (driver mode only; default 2)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds before the driver stops the run")
    return p.parse_args(argv)


def work(argv) -> int:
    args = parse_args(argv)
    os.environ.update(
        {
            "BAGUA_AUTOTUNE_MAX_SAMPLES": str(args.max_samples),
            "BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S": str(args.confidence),
            "BAGUA_AUTOTUNE_WARMUP_TIME_S": str(args.warmup),
            "BAGUA_AUTOTUNE_INTERVAL_STEPS": str(args.interval),
            "BAGUA_AUTOTUNE_CONFIRM_PAIRS": str(args.confirm_pairs),
        }
    )
    import torch

    torch.set_num_threads(1)
    import bagua_torch
    from bagua_core import comm

    group = bagua_torch.init_process_group()
    rank, world = group.rank, group.size
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)

    def stack(n):
        return [m for _ in range(n) for m in (torch.nn.Linear(args.width, args.width), torch.nn.ReLU())]

    class DecoderFirst(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder = torch.nn.Sequential(*stack(args.layers - args.layers // 2))  # registered first, runs second
            self.encoder = torch.nn.Sequential(*stack(args.layers // 2))
            self.head = torch.nn.Linear(args.width, 10)

        def forward(self, x):
            return self.head(self.decoder(self.encoder(x)))

    def build():
        torch.manual_seed(0)
        if args.workload == "decoder-first":
            return DecoderFirst()
        return torch.nn.Sequential(*stack(args.layers), torch.nn.Linear(args.width, 10))

    g = torch.Generator().manual_seed(rank)
    batches = [
        (torch.randn(args.batch_size, args.width, generator=g), torch.randint(0, 10, (args.batch_size,), generator=g))
        for _ in range(8)
    ]
    loss_fn = torch.nn.CrossEntropyLoss()

    def wrap(autotune: bool, trace: str = ""):
        os.environ["BAGUA_AUTOTUNE"] = "1" if autotune else "0"
        os.environ["BAGUA_TRACE"] = trace
        model = build()
        model.bagua_module_name = "autotuned" if autotune else "default traced" if trace else "default"
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        model.with_bagua([opt], bagua_torch.algorithms.GradientAllReduceAlgorithm())
        return model, opt

    def train(model, opt, steps, start=0):
        for i in range(start, start + steps):
            x, y = batches[i % len(batches)]
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

    def barrier():
        comm.barrier(group)

    def plan_text(model):
        sizes = [b.nbytes for b in model.bagua_ddp.buckets]
        return f"{len(sizes)} bucket(s), MiB {[round(s / 2**20, 2) for s in sizes]}"

    def bucket_names(model):
        return [list(b.tensor_names) for b in model.bagua_ddp.buckets]

    n_params = sum(p.numel() for p in build().parameters())
    say(
        f"workload {args.workload}: {args.layers}x{args.width}, {n_params / 1e6:.2f} M parameters "
        f"({n_params * 4 / 2**20:.1f} MiB of float32 gradients); world size {world}, batch {args.batch_size} per rank; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    default, default_opt = wrap(False)
    tuned, tuned_opt = wrap(True)
    session = tuned.bagua_ddp.autotune
    t0 = time.perf_counter()
    steps = 0
    while not session.completed and steps < args.max_tune_steps:
        train(tuned, tuned_opt, args.interval, steps)
        steps += args.interval
    tune_s = time.perf_counter() - t0
    say(
        f"tuning: {steps} steps, {tune_s:.1f} s, {'completed' if session.completed else 'NOT completed'}; "
        f"{len(session.switches)} plan switch(es) at steps {[s for s, _ in session.switches]}"
    )
    verdict = None
    if rank == 0 and session.tuner is not None:
        for s in session.tuner.samples:
            if s.plan_id >= 0:
                say(
                    f"  sample at step {s.train_iter}: buckets of {s.bucket_bytes} B ({s.num_buckets} bucket(s)): "
                    f"{s.score_gbps:.3f} GB/s, median step {s.median_step_s * 1e3:.1f} ms"
                )
        repeats = sum(1 for s in session.tuner.samples if s.plan_id < 0)
        if repeats:
            say(f"  ({repeats} more size(s) asked made the buckets of a measured sample: scored without measuring)")
        for label, s in session.tuner.confirmations:
            say(
                f"  confirmation, {label:9s}: buckets of {s.bucket_bytes} B: median step {s.median_step_s * 1e3:.1f} ms"
            )
        verdict = session.tuner.verdict
        if verdict is not None and verdict.pairs == 0:
            say(f"  verdict: keep the default: {verdict.reason}")
        elif verdict is not None:
            say(
                f"  verdict: {'switch to' if verdict.switched else 'keep the default, not'} the candidate "
                f"({verdict.candidate_bytes} B buckets): {verdict.reason}"
            )
    same_plan = bucket_names(default) == bucket_names(tuned)
    say(f"default plan:   {plan_text(default)} (registration order)")
    say(
        f"autotuned plan: {plan_text(tuned)} (bucket size {session.plan.bucket_bytes} B, "
        f"{'readiness' if session.plan.order is not None else 'registration'} order)"
        + (" = the default plan" if same_plan else "")
    )

    train(default, default_opt, 5)
    order = [("default", default, default_opt)]
    if not same_plan:
        order.append(("autotuned", tuned, tuned_opt))
    if args.trace:
        traced, traced_opt = wrap(False, args.trace)
        train(traced, traced_opt, 5)
        order.append(("default traced", traced, traced_opt))
    samples = args.steps * args.batch_size * world
    per_round = {name: [] for name, _, _ in order}
    load_before = os.getloadavg()[0]
    if len(order) > 1:
        for r in range(args.rounds):
            for name, model, opt in order if r % 2 == 0 else order[::-1]:
                barrier()
                t = time.perf_counter()
                train(model, opt, args.steps)
                barrier()
                per_round[name].append(samples / (time.perf_counter() - t))
    ratios, spread = {}, {}
    for k, v in per_round.items():
        per = sorted(a / d for a, d in zip(v, per_round["default"]))
        ratios[k] = statistics.median(per) if per else 1.0
        spread[k] = (quartiles(per)[0], quartiles(per)[2]) if per else (1.0, 1.0)
    result = {k: statistics.median(v) for k, v in per_round.items() if v}
    if same_plan:
        say(
            "\nautotune kept the default plan: autotuned / default = 1 by construction (the same buckets in the "
            "same order; not timed against each other)"
        )
        ratios["autotuned"], spread["autotuned"] = 1.0, (1.0, 1.0)
    if len(order) > 1:
        say(
            f"\nsamples/s (all ranks, median of {args.rounds} interleaved rounds of {args.steps} steps; ratio to "
            f"default: median [quartiles] of the per-round ratios; load average {load_before:.2f} before, "
            f"{os.getloadavg()[0]:.2f} after):"
        )
        for k in per_round:
            say(f"  {k:15s} {result[k]:8.0f}   {ratios[k]:.3f} [{spread[k][0]:.3f}, {spread[k][1]:.3f}]")
    if args.trace:
        from bagua_core import trace

        trace.close()
        barrier()
        if rank == 0:
            events = [e for r in range(world) for e in trace.load(trace.rank_path(args.trace, r))]
            for (r, _model), s in sorted(trace.summary(events).items()):
                say(
                    f"trace, rank {r}: {s['buckets']} buckets, per step (median) communication {s['comm_ms']:.1f} ms, "
                    f"{100 * s['overlap']:.0f}% of it before backward ended; forward start -> backward end "
                    f"{s['forward_backward_ms']:.1f} ms"
                )
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "samples_per_s": result,
                    "ratio": ratios["autotuned"],
                    "ratio_quartiles": spread["autotuned"],
                    "same_plan": same_plan,
                    "rounds": per_round,
                    "tune_steps": steps,
                    "tune_s": tune_s,
                    "plan_bucket_bytes": session.plan.bucket_bytes,
                    "verdict": None if verdict is None else verdict._asdict(),
                    "default_buckets": [b.nbytes for b in default.bagua_ddp.buckets],
                    "autotuned_buckets": [b.nbytes for b in tuned.bagua_ddp.buckets],
                    "args": vars(args),
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(_launch.main(__file__, work, parse_args))

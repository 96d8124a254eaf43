"""What the Bagua 0.9 launchers share: their Bagua flags, the notice for flags
without meaning here, and the step from parsed flags to ``bagua-run``'s
supervisor (:mod:`bagua_core.launcher`)."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from bagua.run import launch
from bagua_core.launcher.cli import make_config

# flag -> why it does nothing here
NO_EFFECT = {
    "report_metrics": "it had no effect in Bagua 0.9 either",
    "enable_bagua_net": "Bagua-Net is not built; Gloo's TCP transport is used",
}


def add_bagua_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bagua_service_port",
        type=int,
        default=None,
        help="the one extra port Bagua uses on the master: its store (default MASTER_PORT + 1); "
        "sets BAGUA_SERVICE_PORT",
    )
    p.add_argument(
        "--default_bucket_size",
        type=int,
        default=None,
        help="bytes per bucket; sets BAGUA_DEFAULT_BUCKET_SIZE (default 10 MiB)",
    )
    p.add_argument("--autotune_level", type=int, default=None, help="sets BAGUA_AUTOTUNE (>= 1: tune buckets)")
    p.add_argument(
        "--is_output_autotune_log",
        action="store_const",
        const=True,
        default=None,
        help="sets BAGUA_IS_OUTPUT_AUTOTUNE_LOG=1",
    )
    p.add_argument("--report_metrics", action="store_const", const=True, default=None, help="accepted, no effect")
    p.add_argument("--autotune_max_samples", type=int, default=None, help="sets BAGUA_AUTOTUNE_MAX_SAMPLES")
    p.add_argument(
        "--autotune_sampling_confidence_time",
        type=float,
        default=None,
        help="sets BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S",
    )
    p.add_argument("--autotune_warmup_time", type=float, default=None, help="sets BAGUA_AUTOTUNE_WARMUP_TIME_S")
    p.add_argument(
        "--enable_bagua_net",
        action="store_const",
        const=True,
        default=None,
        help="accepted, no effect (Bagua-Net is not built)",
    )


def flag_args(args: argparse.Namespace) -> List[str]:
    """The Bagua flags given in ``args``, as command-line arguments again (to
    hand them to another launcher)."""
    probe = argparse.ArgumentParser(add_help=False)
    add_bagua_flags(probe)
    out = []
    for flag in (action.dest for action in probe._actions):
        value = getattr(args, flag, None)
        if value is True:
            out.append(f"--{flag}")
        elif value is not None:
            out.append(f"--{flag}={value}")
    return out


def notices(prog: str, args: argparse.Namespace, more: dict) -> List[str]:
    """One line per given flag that has no effect here (``more``: flag -> why)."""
    reasons = {**NO_EFFECT, **more}
    return [
        f"{prog}: --{flag} has no effect here: {why}"
        for flag, why in reasons.items()
        if getattr(args, flag, None) not in (None, False)
    ]


def bagua_env(args: argparse.Namespace) -> tuple:
    """The settings given as flags, as the environment the workers get."""
    env = []
    if args.bagua_service_port is not None:
        env.append(("BAGUA_SERVICE_PORT", str(args.bagua_service_port)))
    if args.default_bucket_size is not None:
        env.append(("BAGUA_DEFAULT_BUCKET_SIZE", str(args.default_bucket_size)))
    for flag, name in (
        ("autotune_level", "BAGUA_AUTOTUNE"),
        ("autotune_max_samples", "BAGUA_AUTOTUNE_MAX_SAMPLES"),
        ("autotune_sampling_confidence_time", "BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S"),
        ("autotune_warmup_time", "BAGUA_AUTOTUNE_WARMUP_TIME_S"),
    ):
        if getattr(args, flag) is not None:
            env.append((name, str(getattr(args, flag))))
    if args.is_output_autotune_log:
        env.append(("BAGUA_IS_OUTPUT_AUTOTUNE_LOG", "1"))
    return tuple(env)


def run(parser: argparse.ArgumentParser, messages: List[str], *, master_port: Optional[int], **fields) -> int:
    """Checks the launch like ``bagua-run`` does and runs the workers to the end."""
    if master_port is not None and not 1 <= master_port <= 65534:
        parser.error(f"--master_port must be in 1..65534 (the store uses MASTER_PORT + 1), got {master_port}")
    cfg, warnings = make_config(parser, master_port=master_port, **fields)
    for m in messages + [f"{parser.prog}: warning: {w}" for w in warnings]:
        print(m, file=sys.stderr, flush=True)
    return launch(cfg)

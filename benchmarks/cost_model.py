"""An alpha-beta cost model of a data-parallel training step, fitted on measured runs of
benchmarks/seed_scale.py, validated on the runs left out of the fit, then used to predict the seed's
128-GPU setting (VGG16 and BERT-large, 16 nodes x 8 GPUs, link rate 100 Gbit/s down to 1 Gbit/s).

    python benchmarks/cost_model.py --results a.json b.json ... [--fit-links 100mbit,10gbit] [--fit-hosts 2]
        [--out-dir cost_model_results] [--predict-nodes 1,2,4,8,16 --gpus-per-node 8
        --intra-node-gbytes 150 --gpu-profile a100] [--predict-links 100gbit,...,1gbit] [--paper]

A case is one configuration of one run (a result file holds runs; refused configurations are left
out). S: gradient bytes, n: nodes (hosts), g: processes per node, N = n g.

Bytes a node puts on its inter-node link per step, for one collective on f S bytes (docs/algorithms.md):
    flat ring over N ranks          B = 2(N-1)/N f S,  R = 2(N-1) rounds      (n = 1: inside the node)
    hierarchical                    B = 2(n-1)/n f S,  R = 2(n-1); inside the node 2(g-1)/g S, 2(g-1) rounds
    ring neighbours (left, right)   B = min(2, n-1) f S, R = min(2, n-1); inside the node as hierarchical
    f: 1 (DDP, Horovod, GradientAllReduce, Decentralized: peer_selection_mode "all" averages the weights,
    an allreduce of S), 1/2 (fp16, HalfGrad), 1/4 (8-bit MinMax: ByteGrad, QAdam after its warm-up,
    LowPrecisionDecentralized's differences; the per-chunk min and max are neglected). LocalSteps
    communicates every H = 8 steps (B and R / 8). LowRank and DDP+PowerSGD (rank 1, P and Q: 2
    collectives) take f from the run's ``lowrank_fraction``, else f is calibrated; Async (weights averaged
    in the background) is calibrated as the fraction of a full allreduce per step, bytes and rounds.
Calibration, on the fit set only: the counted bytes (``wire_bytes_per_step``) are w B, w the median of
counted / formula over the configurations with exact formulas (TCP/IP framing, headers); a calibrated
configuration's fraction of 2(N-1)/N S is the median of counted / that, per configuration and model.

Time (ms), per case:
    t_comm = R (alpha + d) + w B / (eta rate) + gamma w B + R_in alpha + B_in / beta_in
    t_step = t_base + overhead[config] + max(0, t_comm - phi t_bwd)
t_base: the run's measured step without communication (same processes, same link) plus the
configuration's codec time; without that measurement, t_compute + t_opt + t_codec. d: the link's
one-way delay; rate: its shaped rate; gamma: this machine's CPU ms per MB sent (sockets, Gloo's
reductions on shared cores); overhead: a configuration's host work per step, whatever the link
(PowerSGD's and LowRank's matrix products, fp16 conversions); beta_in: the intra-node bandwidth (a run's
``intra_node_bytes_per_s``; unknown: that term is 0); t_bwd: the run's backward_fraction (else 2/3) of
t_compute. Fitted: eta (one efficiency for every link), gamma, each configuration's overhead, and per
configuration family alpha (ms per round) and phi (0 to 1.5: how much of backward the communication
hides; 1.5 covers forward too). Least squares on the relative errors (predicted - measured) / measured:
a grid gives the start, damped Gauss-Newton steps (numpy) finish. Measured time: ms_per_step; for
LocalSteps the mean of step_seconds when they span a synchronisation (the median would miss it).
Not modelled: unshaped links (no rate), links delayed by the user-space delay line (its own throughput
bounds them), and "no communication" itself (the base of the others).

Split: the fit set is every case whose link is in --fit-links (default: the links of the lowest and the
highest rate present) or whose host count is in --fit-hosts (default 2); every other case is validated,
and a setting fitted is never validated. Unshaped links (rate_bits null) have no rate: not modelled.

Prediction: per configuration, the compute time of the device-time runs whose profile is --gpu-profile
(each configuration from the run with most hosts that measured it); the optimizer step and the codec as
passes over the profile's GPU memory (20 bytes per parameter for SGD with momentum, 28 for Adam, 10 per
codec pass; the run's host times when the profile has no bandwidth); --gpus-per-node GPUs on NVLink
(--intra-node-gbytes GB/s) per node; the fitted eta and byte fractions only (gpu_model: no alpha, gamma
or overhead, which describe this machine; communication from backward's hooks overlaps backward). BERT-large
epoch: 88,641 SQuAD v1.1 training samples, batch 6 per GPU unless the run says otherwise.

Outputs in --out-dir: cost_model.json (parameters, every case predicted against measured),
cost_model.md (validation table, max |error|, cases within 15%, byte check; also printed) and, with a
profile run, prediction.md, vgg16_128gpu.png and bert_large_epoch.png. Bad input: a message, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

import _hosts  # benchmarks/_hosts.py: link names such as "10gbit+5ms"
import _report  # benchmarks/_report.py: JSON, table, plots
import numpy as np

# configuration: (family, layout, f or how it is calibrated, collectives per step, steps per communication)
LOWRANK, RATE = "lowrank", "rate"
AFTER = "Bagua after the step"
PATTERNS = {
    "DDP": ("torch DDP", "flat", 1.0, 1, 1),
    "DDP+fp16": ("torch DDP", "flat", 0.5, 1, 1),
    "DDP+PowerSGD": ("torch DDP", "flat", LOWRANK, 2, 1),
    "Horovod": ("Horovod", "flat", 1.0, 1, 1),
    "Horovod+fp16": ("Horovod", "flat", 0.5, 1, 1),
    "Bagua GradientAllReduce": ("Bagua gradients", "flat", 1.0, 1, 1),
    "Bagua GradientAllReduce hierarchical": ("Bagua gradients", "hier", 1.0, 1, 1),
    "Bagua ByteGrad": ("Bagua gradients", "hier", 0.25, 1, 1),
    "Bagua ByteGrad+EF": ("Bagua gradients", "hier", 0.25, 1, 1),
    "Bagua HalfGrad": ("Bagua gradients", "flat", 0.5, 1, 1),
    "Bagua Decentralized": ("Bagua weights", "hier", 1.0, 1, 1),
    "Bagua LowPrecisionDecentralized": (AFTER, "neighbours", 0.25, 1, 1),
    "Bagua QAdam": ("Bagua gradients", "hier", 0.25, 1, 1),
    "Bagua LowRank": ("Bagua gradients", "flat", LOWRANK, 2, 1),
    "Bagua LocalSteps": (AFTER, "flat", 1.0, 1, 8),
    "Bagua LocalSteps+8bit": (AFTER, "flat", 0.25, 1, 8),
    "Bagua Async": ("Bagua async", "flat", RATE, 1, 1),
    "JAX Bagua GradientAllReduce": ("JAX", "flat", 1.0, 1, 1),
    "no communication": ("none", "none", 0.0, 0, 1),
}
FAMILIES = tuple(dict.fromkeys(p[0] for p in PATTERNS.values() if p[0] != "none"))
BACKWARD_SHARE = 2 / 3  # backward takes about twice forward
PHI_MAX = 1.5  # = forward and backward when backward is 2/3 of them
WITHIN_PCT = 15.0
SQUAD_TRAIN_SAMPLES = 88641
TARGET_GPUS = 128
DEFAULT_BATCH = {"vgg16": 32, "bert-large": 6}
PAPER = (1.3, 2.0, "published: 1.3-2x DDP end to end (16 x 8 V100, 100 Gbit/s TCP)")
# Bytes per parameter the GPU moves: SGD with momentum reads weight, gradient, momentum and writes weight,
# momentum (float32); Adam also reads and writes v; MinMaxUInt8 compress + decompress: 4 + 1 + 1 + 4.
SGD_BYTES, ADAM_BYTES, CODEC_BYTES = 20, 28, 10
DEFAULT_PREDICT_LINKS = "100gbit,40gbit,25gbit,10gbit,5gbit,2gbit,1gbit"


class InputError(Exception):
    """Input the model cannot use: main prints it and exits with 2."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", nargs="+", required=True, help="result files of benchmarks/seed_scale.py")
    p.add_argument("--fit-links", help="comma-separated links to fit on (default: lowest and highest rate present)")
    p.add_argument("--fit-hosts", default="2", help="comma-separated host counts also fitted on (default 2)")
    p.add_argument("--out-dir", default="cost_model_results", help="where the JSON, tables and figures go")
    p.add_argument("--predict-nodes", default="1,2,4,8,16", help="node counts of the prediction table")
    p.add_argument("--predict-links", default=DEFAULT_PREDICT_LINKS, help="links of the prediction")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--intra-node-gbytes", type=float, default=150.0, help="NVLink GB/s inside a node")
    p.add_argument("--gpu-profile", default="a100", help="profile name of the device-time runs to predict from")
    p.add_argument("--paper", action="store_true", help="show the Bagua paper's published speed-up range")
    a = p.parse_args(argv)
    try:
        a.fit_hosts = {int(h) for h in a.fit_hosts.split(",") if h.strip()}
        a.predict_nodes = sorted({int(n) for n in a.predict_nodes.split(",") if n.strip()})
        a.predict_links = [_hosts.parse_link(link) + (link.strip().lower(),) for link in a.predict_links.split(",")]
    except ValueError as e:
        p.error(str(e))
    if a.gpus_per_node < 1 or a.intra_node_gbytes <= 0 or min(a.predict_nodes, default=0) < 1:
        p.error("--gpus-per-node, --intra-node-gbytes and --predict-nodes must be positive")
    return a


# ----------------------------------------------------------------- input ---


def _need(d, key, where, nullable=False):
    if not isinstance(d, dict) or key not in d or (d[key] is None and not nullable):
        raise InputError(f"{where}: missing field {key!r}" + (" (null)" if isinstance(d, dict) and key in d else ""))
    return d[key]


def make_case(run, config, res, where):
    """One configuration of one run, in the units of the model (ms, bytes)."""
    if config not in PATTERNS:
        raise InputError(f"{where}: unknown configuration {config!r}; known: " + ", ".join(PATTERNS))
    try:
        compute = float(_need(res, "compute_ms", where))
        measured = float(_need(res, "ms_per_step", where))
        steps = res.get("step_seconds") or []
        every = PATTERNS[config][4]
        if every > 1 and len(steps) >= every:
            measured = 1e3 * statistics.fmean(steps)
        case = {
            "where": where,
            "model": str(_need(run, "model", where)),
            "config": config,
            "link": str(_need(run, "link", where)),
            "rate_bits": _need(run, "rate_bits", where, nullable=True),
            "delay_ms": float(run.get("delay_ms") or 0.0),
            "hosts": int(_need(run, "hosts", where)),
            "g": int(_need(run, "nproc_per_host", where)),
            "S": float(_need(run, "grad_bytes", where)),
            "batch": int(run.get("batch_size") or DEFAULT_BATCH.get(run.get("model"), 0)),
            "measured_ms": measured,
            "compute_ms": compute,
            "bwd_ms": compute * float(run.get("backward_fraction") or BACKWARD_SHARE),
            "base_ms": (_floor_ms(run) or compute + float(_need(res, "optimizer_ms", where)))
            + float(res.get("compression_cpu_ms") or 0),
            "wire": res.get("wire_bytes_per_step"),
            "lowrank_fraction": run.get("lowrank_fraction"),
            "delay_method": run.get("delay_method"),
            "intra_Bps": run.get("intra_node_bytes_per_s"),
        }
    except (TypeError, ValueError) as e:
        raise InputError(f"{where}: a field has the wrong type ({e})") from None
    if case["rate_bits"] is not None:
        case["rate_bits"] = float(case["rate_bits"])
    if case["S"] <= 0 or case["hosts"] < 1 or case["g"] < 1 or measured <= 0:
        raise InputError(f"{where}: grad_bytes, hosts, nproc_per_host and ms_per_step must be positive")
    return case


def _floor_ms(run):
    """The run's measured step without communication (same processes, same link), or None: what a
    step costs on this machine besides communicating (replayed compute, accumulating the gradients,
    the optimizer), which the replay's GPU times leave out."""
    r = run.get("results", {}).get("no communication", {})
    return float(r["ms_per_step"]) if r.get("ms_per_step") else None


def load_cases(paths):
    cases, runs = [], []
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except OSError as e:
            raise InputError(f"{path}: cannot read it ({e.strerror})") from None
        except ValueError as e:
            raise InputError(f"{path}: not JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("benchmark", "seed_scale") != "seed_scale":
            raise InputError(f"{path}: not a result of benchmarks/seed_scale.py")
        for i, run in enumerate(_need(doc, "runs", path)):
            where = f"{path}, run {i}"
            profile = doc.get("profile") if isinstance(doc.get("profile"), dict) else {}
            run = {**run, "mode": doc.get("mode"), "profile": profile, "file": path}
            runs.append(run)
            for config, res in _need(run, "results", where).items():
                if not (isinstance(res, dict) and "refused" in res):
                    cases.append(make_case(run, config, res, f"{where}, {config!r}"))
    if not cases:
        raise InputError("no measured case in " + ", ".join(paths))
    return cases, runs


def setting(c):
    """What makes two cases the same measurement (a repeat of it is the same setting)."""
    return (c["model"], c["config"], c["hosts"], c["g"], c["link"], c["batch"])


def split(cases, fit_links, fit_hosts):
    shaped = [c for c in cases if c["rate_bits"]]
    if not shaped:
        raise InputError("no case on a shaped link (every rate_bits is null): nothing to fit")
    if fit_links is None:
        rates = {min(c["rate_bits"] for c in shaped), max(c["rate_bits"] for c in shaped)}
        fit_links = {c["link"].lower() for c in shaped if c["rate_bits"] in rates}
    else:
        fit_links = {link.strip().lower() for link in fit_links.split(",") if link.strip()}
        present = {c["link"].lower() for c in shaped}
        if fit_links - present:
            raise InputError(f"--fit-links {sorted(fit_links - present)}: no such link; present: {sorted(present)}")
    fit = [c for c in shaped if c["link"].lower() in fit_links or c["hosts"] in fit_hosts]
    fitted = {setting(c) for c in fit}
    val = [c for c in shaped if c["link"].lower() not in fit_links and c["hosts"] not in fit_hosts]
    val = [c for c in val if setting(c) not in fitted]  # a setting fitted is never validated
    if not val:
        raise InputError(
            f"nothing to validate: every case is in the fit set (links {sorted(fit_links)}, hosts "
            f"{sorted(fit_hosts)}); leave some links or host counts out with --fit-links / --fit-hosts"
        )
    return fit, val, [c for c in cases if not c["rate_bits"]], sorted(fit_links)


# ----------------------------------------------------------------- bytes ---


def pattern_bytes(layout, n, g, S, f):
    """(inter-node bytes, rounds, intra-node bytes, rounds) of one collective of a node, f S on the wire."""
    N = n * g
    if layout == "none" or N == 1:
        return 0.0, 0, 0.0, 0
    if layout == "flat" and n == 1:
        return 0.0, 0, 2 * (g - 1) / g * f * S, 2 * (g - 1)
    if layout == "flat":
        return 2 * (N - 1) / N * f * S, 2 * (N - 1), 0.0, 0
    intra, r_intra = 2 * (g - 1) / g * S, 2 * (g - 1)  # full precision inside the node
    if layout == "neighbours":
        return min(2, n - 1) * f * S, min(2, n - 1), intra, r_intra
    return 2 * (n - 1) / n * f * S, 2 * (n - 1), intra, r_intra


def _how(c):
    """("exact", f) or (calibration kind, None) for a case's bytes."""
    f = PATTERNS[c["config"]][2]
    if f == LOWRANK and c["lowrank_fraction"] is not None:
        return "exact", float(c["lowrank_fraction"])
    return ("exact", f) if isinstance(f, float) else (f, None)


def calibrate(fit):
    """The wire factor w and each calibrated (configuration, model)'s fraction, from the fit set's counts."""
    ratios, fractions = [], {}
    for c in fit:
        if c["wire"] is None:
            continue
        layout, every = PATTERNS[c["config"]][1], PATTERNS[c["config"]][4]
        kind, f = _how(c)
        if kind == "exact":
            payload = pattern_bytes(layout, c["hosts"], c["g"], c["S"], f)[0] / every
            if payload > 0:
                ratios.append(c["wire"] / payload)
        else:
            unit = pattern_bytes(layout, c["hosts"], c["g"], c["S"], 1.0)[0]
            fractions.setdefault(c["config"], {}).setdefault(c["model"], []).append(c["wire"] / unit)
    return {
        "wire_factor": statistics.median(ratios) if ratios else 1.0,
        "fractions": {k: {m: statistics.median(v) for m, v in d.items()} for k, d in fractions.items()},
    }


def case_terms(c, calib):
    """Per-step terms of t_comm: rounds, fixed ms (delays, intra-node), line ms (bytes at the full rate)."""
    family, layout, _, k, every = PATTERNS[c["config"]]
    kind, f = _how(c)
    if kind == "exact":
        b, r, b_in, r_in = pattern_bytes(layout, c["hosts"], c["g"], c["S"], f)
        wire, rounds = calib["wire_factor"] * b, k * r
    else:
        frac = calib["fractions"].get(c["config"], {}).get(c["model"])
        if frac is None:
            raise InputError(
                f"{c['config']} on {c['model']}: its bytes are calibrated from counted wire_bytes_per_step, "
                "and no case of the fit set counted them" + (" (or give lowrank_fraction)" if kind == LOWRANK else "")
            )
        b, r, b_in, r_in = pattern_bytes(layout, c["hosts"], c["g"], c["S"], 1.0)
        wire, rounds, b_in = frac * b, (frac if kind == RATE else 1.0) * k * r, frac * b_in
        r_in = (frac if kind == RATE else 1.0) * k * r_in
    intra_ms = b_in / (c["intra_Bps"] / 1e3) if c["intra_Bps"] else 0.0
    line_ms = wire / (c["rate_bits"] / 8e3) if wire else 0.0
    return {
        "family": family,
        "bytes": wire / every,
        "rounds": (rounds + r_in) / every,
        "fixed": (rounds * c["delay_ms"] + intra_ms) / every,
        "line": line_ms / every,
    }


# ------------------------------------------------------------------- fit ---


def _arrays(cases, calib):
    terms = [case_terms(c, calib) for c in cases]
    a = {k: np.array([t[k] for t in terms], dtype=float) for k in ("rounds", "fixed", "line")}
    a["mb"] = np.array([t["bytes"] / 1e6 for t in terms], dtype=float)
    a["base"] = np.array([c["base_ms"] for c in cases])
    a["bwd"] = np.array([c["bwd_ms"] for c in cases])
    a["meas"] = np.array([c["measured_ms"] for c in cases])
    a["fam"] = np.array([FAMILIES.index(t["family"]) if t["family"] in FAMILIES else -1 for t in terms])
    a["cfg"] = np.array([list(PATTERNS).index(c["config"]) for c in cases])
    return a, terms


def step_ms(a, eta, alpha, phi, gamma=0.0, overhead=None):
    """t_step of each case; alpha and phi indexed by family (the "none" family: no communication);
    gamma: ms of this machine's CPU per MB a node sends (sockets, Gloo's reductions, 2 cores shared);
    overhead: ms of host work per step of each configuration (indexed as PATTERNS: PowerSGD's and
    LowRank's matrix products, fp16 conversions on this CPU), whatever the link."""
    fam = a["fam"]
    extra = np.asarray(overhead)[a["cfg"]] if overhead is not None else 0.0
    al = np.where(fam >= 0, np.asarray(alpha)[fam], 0.0)
    ph = np.where(fam >= 0, np.asarray(phi)[fam], 0.0)
    comm = a["rounds"] * al + a["fixed"] + a["line"] / eta + gamma * a["mb"]
    return a["base"] + extra + np.maximum(0.0, comm - ph * a["bwd"])


def _grid_start(a, fams):
    """eta, and per family (alpha, phi), minimising the sum of squared relative errors on a grid."""
    etas, phis = np.linspace(0.05, 1.0, 20), np.linspace(0.0, PHI_MAX, 16)
    alphas = np.concatenate([[0.0], np.geomspace(1e-3, 100.0, 23)])
    best = {}
    total = np.zeros(etas.size)
    for f in fams:
        m = a["fam"] == f
        comm = (a["rounds"][m] * alphas[:, None])[None] + a["fixed"][m] + a["line"][m] / etas[:, None, None]
        pred = a["base"][m] + np.maximum(0.0, comm[:, None] - phis[None, :, None, None] * a["bwd"][m])
        sse = (((pred - a["meas"][m]) / a["meas"][m]) ** 2).sum(-1)  # (eta, phi, alpha)
        total += sse.min(axis=(1, 2))
        best[f] = sse
    e = int(total.argmin())
    start = {f: np.unravel_index(best[f][e].argmin(), best[f][e].shape) for f in fams}
    return etas[e], {f: alphas[start[f][1]] for f in fams}, {f: phis[start[f][0]] for f in fams}


def _least_squares(resid, p, lo, hi, iters=60):
    """Damped Gauss-Newton (Levenberg-Marquardt) within [lo, hi], numeric Jacobian."""
    r, lam = resid(p), 1e-3
    cost = r @ r
    for _ in range(iters):
        J = np.empty((r.size, p.size))
        for j in range(p.size):
            h = 1e-6 * max(1.0, abs(p[j]))
            q = p.copy()
            q[j] += h
            J[:, j] = (resid(q) - r) / h
        A = J.T @ J
        step = np.linalg.lstsq(A + lam * np.diag(np.diag(A) + 1e-12), -J.T @ r, rcond=None)[0]
        q = np.clip(p + step, lo, hi)
        rq = resid(q)
        if rq @ rq < cost:
            done = cost - rq @ rq < 1e-12 * max(cost, 1e-30)
            p, r, cost, lam = q, rq, rq @ rq, lam / 3
            if done:
                break
        else:
            lam *= 10
            if lam > 1e8:
                break
    return p


def fit(cases, calib):
    a, _ = _arrays(cases, calib)
    fams = sorted(set(a["fam"][a["fam"] >= 0].tolist()))
    eta0, al0, ph0 = _grid_start(a, fams)
    F = len(FAMILIES)

    cfgs = sorted(set(a["cfg"][a["fam"] >= 0].tolist()))  # "no communication" is the base: no overhead
    k = 1 + 2 * len(fams)

    def unpack(p):
        alpha, phi, over = np.zeros(F), np.zeros(F), np.zeros(len(PATTERNS))
        alpha[fams], phi[fams] = p[1 : 1 + len(fams)], p[1 + len(fams) : k]
        over[cfgs] = p[k + 1 :]
        return p[0], alpha, phi, p[k], over

    def resid(p):
        return (step_ms(a, *unpack(p)) - a["meas"]) / a["meas"]

    p0 = np.array([eta0] + [al0[f] for f in fams] + [ph0[f] for f in fams] + [0.0] + [0.0] * len(cfgs))
    lo = np.array([0.01] + [0.0] * len(fams) * 2 + [0.0] + [0.0] * len(cfgs))
    hi = np.array([1.0] + [1e3] * len(fams) + [PHI_MAX] * len(fams) + [100.0] + [1e5] * len(cfgs))
    eta, alpha, phi, gamma, over = unpack(_least_squares(resid, p0, lo, hi))
    return {
        "efficiency": float(eta),
        "cpu_ms_per_mb": float(gamma),
        "overhead_ms": {list(PATTERNS)[i]: float(over[i]) for i in cfgs},
        "families": {
            FAMILIES[f]: {"alpha_ms": float(alpha[f]), "phi": float(phi[f]), "fit_cases": int((a["fam"] == f).sum())}
            for f in fams
        },
    }


def _params(model):
    alpha = [model["families"].get(f, {}).get("alpha_ms", math.nan) for f in FAMILIES]
    phi = [model["families"].get(f, {}).get("phi", math.nan) for f in FAMILIES]
    over = [model.get("overhead_ms", {}).get(c, 0.0) for c in PATTERNS]
    return model["efficiency"], alpha, phi, model.get("cpu_ms_per_mb", 0.0), over


def predict(cases, calib, model):
    """Predicted ms and bytes per step of each case (needs its family fitted). A model whose
    ``cpu_ms_per_mb`` is 0 predicts a machine whose collectives cost no host CPU (GPUs, NCCL)."""
    missing = {PATTERNS[c["config"]][0] for c in cases} - set(model["families"]) - {"none"}
    if missing:
        raise InputError(f"no case of the fit set belongs to the families {sorted(missing)}: widen the fit set")
    a, terms = _arrays(cases, calib)
    return step_ms(a, *_params(model)), [t["bytes"] for t in terms]


# ------------------------------------------------------------ prediction ---


def profile_runs(runs, profile):
    """Per model of the seed's setting, its device-time runs under ``profile`` as one: each configuration
    measured, from the run with most hosts that ran it (the replayed compute is the same in all)."""
    chosen = {}
    for run in sorted(runs, key=lambda r: -r["hosts"]):
        if run["mode"] == "device-time" and run["profile"].get("name") == profile and run.get("model") in DEFAULT_BATCH:
            merged = chosen.setdefault(run["model"], {**run, "results": {}})
            for config, res in run["results"].items():
                if "refused" not in res and config not in merged["results"]:
                    merged["results"][config] = res
    return chosen


def gpu_side_ms(run, config, res):
    """The optimizer step and the codec on the profile's GPU, as passes over its memory (HBM); without
    the profile's bandwidth, the run's times (measured on the host)."""
    hbm = run["profile"].get("hbm_gbytes_per_s")
    if not hbm:
        return float(res["optimizer_ms"]), float(res.get("compression_cpu_ms") or 0.0)
    params, per_ms = run["grad_bytes"] / 4, hbm * 1e6
    passes = (res.get("compression_cpu_ms") or 0.0) / run["codec_ms"] if run.get("codec_ms") else 0.0
    opt = ADAM_BYTES if config == "Bagua QAdam" else SGD_BYTES
    return opt * params / per_ms, passes * CODEC_BYTES * params / per_ms


# Families whose communication runs while backward does (gradient hooks, decentralized exchange).
OVERLAPS_BACKWARD = ("torch DDP", "Horovod", "Bagua gradients", "Bagua weights")


def gpu_model(model):
    """The fitted model carried to GPU nodes: the link efficiency eta and the byte counts only. The
    latency (alpha), CPU (gamma) and overlap (phi) fitted here describe this machine's Gloo on 2 shared
    cores, whose replayed compute is too short for phi to be identified; on GPU nodes NCCL costs no
    host CPU per byte and its per-round latency is small beside megabytes per round, and communication
    started from backward's hooks overlaps backward (phi 1), the rest none."""
    fams = {f: {"alpha_ms": 0.0, "phi": 1.0 if f in OVERLAPS_BACKWARD else 0.0} for f in model["families"]}
    return {**model, "families": fams, "cpu_ms_per_mb": 0.0, "overhead_ms": {}}


def predict_setting(args, runs, calib, model):
    out = {}
    nodes = sorted(set(args.predict_nodes) | {TARGET_GPUS // args.gpus_per_node})
    for name, run in profile_runs(runs, args.gpu_profile).items():
        rows, skipped = [], {}
        batch = int(run.get("batch_size") or DEFAULT_BATCH[name])
        for config, res in run["results"].items():
            if "refused" in res:
                continue
            cases = []
            for n in nodes:
                for rate, delay, link in args.predict_links:
                    c = make_case({**run, "hosts": n, "nproc_per_host": args.gpus_per_node}, config, res, run["file"])
                    c.update(rate_bits=_hosts.rate_bits(rate), delay_ms=delay or 0.0, link=link)
                    c["intra_Bps"] = args.intra_node_gbytes * 1e9
                    c["base_ms"] = c["compute_ms"] + sum(gpu_side_ms(run, config, res))
                    cases.append(c)
            try:
                ms = predict(cases, calib, gpu_model(model))[0]
            except InputError as e:  # its family or its bytes were not fitted
                skipped[config] = str(e)
                continue
            for c, t in zip(cases, ms.tolist()):
                gpus = c["hosts"] * c["g"]
                rows.append(
                    {"config": config, "nodes": c["hosts"], "gpus": gpus, "link": c["link"], "ms_per_step": t,
                     "samples_per_s": gpus * batch / t * 1e3,
                     "epoch_s": math.ceil(SQUAD_TRAIN_SAMPLES / (gpus * batch)) * t / 1e3}
                )  # fmt: skip
        out[name] = {"run": run["file"], "hosts_measured": run["hosts"], "batch": batch, "rows": rows,
                     "not_predicted": skipped}  # fmt: skip
    return out


# ---------------------------------------------------------------- output ---


def _pct(pred, meas):
    return 100.0 * (pred - meas) / meas


def why_not(c, calib, model=None):
    """Why a case cannot be modelled (None: it can)."""
    if not c["rate_bits"]:
        return "unshaped link: no rate"
    if c["config"] == "no communication":
        return "the measured floor every other case of its run stands on (its base), not a prediction"
    if c.get("delay_method") == "delay line":
        return "delayed by the user-space delay line, whose own throughput (not the link's rate) bounds it"
    family, kind = PATTERNS[c["config"]][0], _how(c)[0]
    if kind != "exact" and c["model"] not in calib["fractions"].get(c["config"], {}):
        hint = " (or give lowrank_fraction)" if kind == LOWRANK else ""
        return f"bytes calibrated from wire_bytes_per_step, which no fit case of it counted{hint}"
    if model is not None and family != "none" and family not in model["families"]:
        return f"no fit case of its family ({family})"
    return None


def _modelled(cases, calib, model, left_out):
    """The cases that can be modelled; the others go to ``left_out`` with the reason."""
    kept = []
    for c in cases:
        why = why_not(c, calib, model)
        if why is None:
            kept.append(c)
        else:
            left_out.append((c, why))
    return kept


def case_rows(sets, calib, model, left_out):
    rows = []
    for name, cases in sets.items():
        ms, wire = predict(cases, calib, model)
        for c, p, b in zip(cases, ms.tolist(), wire):
            row = {**_row(c, name), "predicted_ms": p, "error_pct": _pct(p, c["measured_ms"]), "predicted_bytes": b}
            row["bytes_error_pct"] = _pct(b, c["wire"]) if c["wire"] else None
            rows.append(row)
    return rows + [{**_row(c, "not modelled"), "why": why} for c, why in left_out]


def _row(c, name):
    keys = ("model", "config", "hosts", "g", "link", "measured_ms", "wire", "where")
    return {"set": name, **{k: c[k] for k in keys}}


def md_table(head, rows):
    """A markdown table; columns whose name ends in a unit or % are right-aligned."""
    right = ("ms", "%", "MB", "hosts", "nodes", "cases", "phi", "round", "bit")
    align = ["---:" if h.endswith(right) else "---" for h in head]
    return ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"] + ["| " + " | ".join(map(str, r)) + " |" for r in rows]  # fmt: skip


def format_tables(doc):
    val = [r for r in doc["cases"] if r["set"] == "validation"]
    s, m, cal = doc["summary"], doc["model"], doc["calibration"]
    out = ["## Validation: cases left out of the fit", ""]
    out += md_table(
        ["model", "configuration", "hosts", "link", "measured ms", "predicted ms", "error %"],
        [[r["model"], r["config"], r["hosts"], r["link"], f"{r['measured_ms']:.1f}", f"{r['predicted_ms']:.1f}",
          f"{r['error_pct']:+.1f}"] for r in val],
    )  # fmt: skip
    out += ["", f"max |error| {s['max_abs_error_pct']:.1f}% over {s['validated']} cases; {s['within_15pct']} of "
            f"{s['validated']} within {WITHIN_PCT:.0f}%. Fitted on {s['fitted']} cases (links "
            f"{', '.join(doc['fit_links'])}; hosts {', '.join(map(str, doc['fit_hosts']))}).", "",
            "## Fitted parameters", "",
            f"eta (share of the link rate) {m['efficiency']:.3f}; this machine's CPU per MB sent gamma "
            f"{m.get('cpu_ms_per_mb', 0.0):.3f} ms (left out of the GPU prediction); wire factor w "
            f"{cal['wire_factor']:.3f}", ""]  # fmt: skip
    out += md_table(
        ["family", "alpha ms per round", "phi", "fit cases"],
        [[f, f"{p['alpha_ms']:.3f}", f"{p['phi']:.2f}", p["fit_cases"]] for f, p in m["families"].items()],
    )
    if cal["fractions"]:
        out += ["", "Calibrated bytes per step, as a fraction of 2(N-1)/N S (counted, framing included):", ""]
        out += [f"- {k}: " + ", ".join(f"{m} {v:.4f}" for m, v in d.items()) for k, d in cal["fractions"].items()]
    counted = [r for r in doc["cases"] if r["wire"] is not None and r["set"] != "not modelled"]
    out += ["", "## Bytes per step on a node's link: predicted against counted", ""]
    out += md_table(
        ["model", "configuration", "hosts", "link", "set", "predicted MB", "counted MB", "error %"],
        [[r["model"], r["config"], r["hosts"], r["link"], r["set"], f"{r['predicted_bytes'] / 1e6:.2f}",
          f"{r['wire'] / 1e6:.2f}", "-" if r["bytes_error_pct"] is None else f"{r['bytes_error_pct']:+.1f}"]
         for r in counted],
    )  # fmt: skip
    why = {}
    for r in doc["cases"]:
        if r["set"] == "not modelled":
            why.setdefault(r["why"], []).append(f"{r['model']} {r['config']} {r['hosts']} hosts {r['link']}")
    out += ["", "Not modelled:"] if why else []
    out += [f"- {w}: {len(v)} cases ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})" for w, v in why.items()]
    return "\n".join(out)


def format_prediction(doc, args):
    out, m = [], doc["model"]
    for name, p in doc["prediction"].items():
        links = list(dict.fromkeys(r["link"] for r in p["rows"]))
        cells = {(r["config"], r["nodes"], r["link"]): f"{r['samples_per_s']:.0f}" for r in p["rows"]}
        out += [f"## {name}: predicted samples/s of all GPUs", "",
                f"({args.gpus_per_node} GPUs per node, NVLink {args.intra_node_gbytes:g} GB/s, batch {p['batch']} per "
                f"GPU; compute of {args.gpu_profile} from {p['run']})", ""]  # fmt: skip
        keys = dict.fromkeys((r["config"], r["nodes"]) for r in p["rows"])
        out += md_table(["configuration", "nodes", *links], [[c, n, *(cells[c, n, x] for x in links)] for c, n in keys])
        out += [""] + [f"not predicted, {config}: {why}" for config, why in p["not_predicted"].items()]
    out.append(
        f"Fitted on the measured hosts: eta {m['efficiency']:.3f}; alpha ms per round "
        + ", ".join(f"{f} {p['alpha_ms']:.3f}" for f, p in m["families"].items())
        + ". A flat ring over N GPUs takes 2(N-1) rounds, a hierarchical one 2(n-1) between nodes."
    )
    return "\n".join(out + (["", paper_note(doc)] if args.paper else []))


def _at_target(doc, model):
    return [r for r in doc["prediction"].get(model, {}).get("rows", []) if r["gpus"] == TARGET_GPUS]


def paper_note(doc):
    said = []
    for model, config in (("vgg16", "Bagua ByteGrad"), ("bert-large", "Bagua QAdam")):
        ms = {r["config"]: r["ms_per_step"] for r in _at_target(doc, model) if r["link"] == "100gbit"}
        if config in ms and "DDP" in ms:
            said.append(f"{model} {config} {ms['DDP'] / ms[config]:.2f}x DDP")
    return f"{PAPER[2]}, for VGG16 with ByteGrad and BERT-large with QAdam; predicted here at {TARGET_GPUS} GPUs, 100 Gbit/s: {', '.join(said) or 'n/a'}."


def _plot(doc, path, model, draw):
    """One figure of the prediction at TARGET_GPUS: ``draw(ax, rows, links, colours)``, legend outside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _at_target(doc, model)
    links = list(dict.fromkeys(r["link"] for r in rows))
    fig, ax = plt.subplots(figsize=(12, 5))
    draw(ax, rows, links, plt.get_cmap("tab20"))
    ax.set_xticks(range(len(links)), links)
    ax.set_xlabel("inter-node bandwidth")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_vgg(doc, path):
    def draw(ax, rows, links, colours):
        for i, config in enumerate(dict.fromkeys(r["config"] for r in rows)):
            ys = {r["link"]: r["samples_per_s"] for r in rows if r["config"] == config}
            dashed = config.startswith(("DDP", "Horovod"))
            ax.plot([ys[x] for x in links], marker="o", label=config, color=colours(i % 20), ls="--" if dashed else "-")
        ddp = {r["link"]: r["samples_per_s"] for r in rows if r["config"] == "DDP"}
        if doc["paper"] and "100gbit" in ddp:  # the published range is for 100 Gbit/s only
            x, d = links.index("100gbit"), ddp["100gbit"]
            ax.fill_between([x - 0.2, x + 0.2], PAPER[0] * d, PAPER[1] * d, color="grey", alpha=0.3, label=PAPER[2])
        ax.set(ylabel=f"images/s (all {TARGET_GPUS} GPUs)", title=f"VGG16, {TARGET_GPUS} GPUs: predicted")

    _plot(doc, path, "vgg16", draw)


def plot_bert(doc, path):
    def draw(ax, rows, links, colours):
        minutes = {(r["config"], r["link"]): r["epoch_s"] / 60 for r in rows}
        configs = list(dict.fromkeys(r["config"] for r in rows))
        w = 0.8 / len(configs)
        for i, config in enumerate(configs):
            xs = [j + i * w - 0.4 for j in range(len(links))]
            ax.bar(xs, [minutes[config, x] for x in links], w, label=config, color=colours(i % 20), align="edge")
        if doc["paper"] and ("DDP", "100gbit") in minutes:
            x, d = links.index("100gbit"), minutes["DDP", "100gbit"]
            ax.fill_between([x - 0.45, x + 0.45], d / PAPER[1], d / PAPER[0], color="grey", alpha=0.3, label=PAPER[2])
        ax.set(ylabel="epoch time (min)", title=f"BERT-large, one epoch of SQuAD v1.1 (88,641 samples), {TARGET_GPUS} GPUs: predicted")  # fmt: skip

    _plot(doc, path, "bert-large", draw)


def run(args):
    cases, runs = load_cases(args.results)
    fit_set, val, unshaped, fit_links = split(cases, args.fit_links, args.fit_hosts)
    calib = calibrate(fit_set)
    left_out = [(c, why_not(c, calib)) for c in unshaped]
    fit_set = _modelled(fit_set, calib, None, left_out)
    if not fit_set:
        raise InputError("no case of the fit set can be modelled: " + "; ".join(sorted({w for _, w in left_out})))
    model = fit(fit_set, calib)
    val = _modelled(val, calib, model, left_out)
    if not val:
        raise InputError("nothing to validate: no case left out of the fit can be modelled: " + left_out[-1][1])
    rows = case_rows({"fit": fit_set, "validation": val}, calib, model, left_out)
    errs = [abs(r["error_pct"]) for r in rows if r["set"] == "validation"]
    doc = {
        "benchmark": "cost_model",
        "results": list(args.results),
        "fit_links": fit_links,
        "fit_hosts": sorted(args.fit_hosts),
        "model": model,
        "calibration": calib,
        "cases": rows,
        "summary": {
            "validated": len(errs),
            "fitted": len(fit_set),
            "max_abs_error_pct": max(errs),
            "within_15pct": sum(e <= WITHIN_PCT for e in errs),
        },
        "paper": bool(args.paper),
    }
    doc["prediction"] = predict_setting(args, runs, calib, model)
    plots = {}
    if "vgg16" in doc["prediction"]:
        plots["vgg16_128gpu.png"] = plot_vgg
    if "bert-large" in doc["prediction"]:
        plots["bert_large_epoch.png"] = plot_bert
    os.makedirs(args.out_dir, exist_ok=True)
    if doc["prediction"]:
        with open(os.path.join(args.out_dir, "prediction.md"), "w") as f:
            f.write(format_prediction(doc, args) + "\n")
    else:
        print(f"no device-time run with profile {args.gpu_profile!r}: no 128-GPU prediction", flush=True)
    _report.write_outputs(doc, args.out_dir, "cost_model", format_tables(doc), plots)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except InputError as e:
        print(f"cost_model.py: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())

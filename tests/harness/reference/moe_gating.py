"""numpy reference of MoE gating (Bagua 0.9.2 / DeepSpeed 2021 semantics),
written token by token, independently of bagua_torch.moe.gating: which
expert each token chooses, which tokens an over-full expert keeps, their
slots and weights, the load-balancing loss and the expert counts."""

from __future__ import annotations

import math

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def capacity(s: int, e: int, k: int, factor: float, min_capacity: int) -> int:
    c = math.ceil(k * s / e * factor)
    return max(c, min_capacity) if k == 1 else c


def top1(logits, cap, used=None, selection_noise=None, routing_logits=None):
    """(l_aux, combine [S, E, C], exp_counts [E])."""
    gates = softmax(logits.astype(np.float64))
    s, e = gates.shape
    route = gates if routing_logits is None else routing_logits
    choice = [int(np.argmax(route[t])) if used is None or used[t] else -1 for t in range(s)]
    counts = np.array([sum(1 for c in choice if c == x) for x in range(e)])
    frac = counts / s
    l_aux = float(np.sum(gates.mean(axis=0) * frac) * e)
    combine = np.zeros((s, e, cap))
    for x in range(e):
        chosen = [t for t in range(s) if choice[t] == x]
        # keep the `cap` of largest noise, then number the kept tokens in token order
        kept = sorted(sorted(chosen, key=lambda t: -selection_noise[t, x])[:cap])
        for slot, t in enumerate(kept):
            combine[t, x, slot] = gates[t, x]
    return l_aux, combine, counts


def top2(logits, cap, second_noise, used=None):
    gates = softmax(logits.astype(np.float64))
    s, e = gates.shape
    first, second = [], []
    for t in range(s):
        if used is not None and not used[t]:
            first.append(-1)
            second.append(-1)
            continue
        a = int(np.argmax(gates[t]))
        noisy = logits[t].astype(np.float64) + second_noise[t]
        noisy[a] = -np.inf
        first.append(a)
        second.append(int(np.argmax(noisy)))
    counts = np.array([sum(1 for c in first if c == x) for x in range(e)])
    l_aux = float(np.mean(gates.mean(axis=0) * counts / s) * e * e)
    combine = np.zeros((s, e, cap))
    filled = [0] * e
    slot1, slot2 = [None] * s, [None] * s
    for t in range(s):  # first choices take the first slots, in token order
        if first[t] >= 0:
            if filled[first[t]] < cap:
                slot1[t] = filled[first[t]]
            filled[first[t]] += 1
    for t in range(s):  # then second choices
        if second[t] >= 0:
            if filled[second[t]] < cap:
                slot2[t] = filled[second[t]]
            filled[second[t]] += 1
    for t in range(s):
        w1 = gates[t, first[t]] if slot1[t] is not None else 0.0
        w2 = gates[t, second[t]] if slot2[t] is not None else 0.0
        denom = max(w1 + w2, np.finfo(np.float32).eps)
        if slot1[t] is not None:
            combine[t, first[t], slot1[t]] = w1 / denom
        if slot2[t] is not None:
            combine[t, second[t], slot2[t]] += w2 / denom
    return l_aux, combine, counts

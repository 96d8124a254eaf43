"""Checkpoints in Bagua 0.9.2's layout, written so that a crash or a kill
never leaves a bad one in use: ``save_checkpoint`` / ``load_checkpoint``
and :class:`PreemptionGuard`.

Layout under ``checkpoints_path``: ``latest_checkpointed_iteration.txt`` (the
last complete iteration) and, in ``iter_{iteration:07d}/``,
``mp_rank_00_model_states.pt`` (rank 0: ``{"iteration", "model",
"optimizer", "algorithm", "lr_scheduler", "bagua_version"}``; "algorithm"
is ``model.bagua_ddp.state_dict()`` of a model wrapped by ``with_bagua``, while
a :class:`bagua_torch.DistributedDataParallel`'s own state dict carries it),
``rng_rank_{r}.pt`` (each
rank's torch, CUDA, Python and numpy random states),
``rank_{r}_states.pt`` (ranks r >= 1, where the wrapped model's algorithm
keeps state that differs per rank, :attr:`bagua_core.algorithms.Plan.state_per_rank`:
``{"model", "optimizer", "algorithm"}`` of that rank, so that error-feedback residuals,
local optimizers and decentralized replicas resume exactly; loaded by as many
ranks as saved it, while another number of ranks takes rank 0's everywhere,
with a warning) and ``manifest_rank_{r}.json`` (each file rank r wrote, with
its size and CRC-32). Every rank calls both functions.

A model holding :class:`bagua_torch.moe.MoE` layers is saved in Bagua 0.9's
expert-parallel layout: ``expert_{g}_mp_rank_00_model_states.pt`` holds
expert g's parameters (written by the rank holding it, keys naming the
expert by its number g in the job), ``expp_rank_{r}_mp_rank_00_optim_states.pt``
holds ``{"optimizer": ...}`` of rank r, and rank 0's file the rest of the
model. Loading needs the same number of experts in the job (world size ×
``num_local_experts``), arranged over any number of ranks; another number is
refused naming both. The optimizer's state loads only onto as many ranks as
saved it.

Writes: each file goes to ``NAME.tmp``, is synced to disk and renamed; the
manifests follow, and the tracker is written (the same way) only once every
rank's files are complete, so a kill at any moment leaves the last complete
checkpoint named. A rank that cannot write makes every rank raise OSError,
and the tracker keeps its old value. ``keep_last=K`` removes all but the K
newest iterations after the tracker moved.

Loads: the files each rank reads are checked against the manifests (size,
CRC-32). If any rank finds one missing, truncated or altered, every rank
warns (RuntimeWarning naming the file and why) and falls back to the
iteration before, and so on; with none left, RuntimeError lists what was
wrong with each. A checkpoint without manifests (Bagua 0.9.2's) loads
unverified, with a warning. ``load_rng=True`` (default) restores each rank's
random states, so a resumed run draws what the uninterrupted one would have.
"""

from bagua_core.preemption import PreemptionGuard
from bagua_torch.checkpoint.checkpointing import load_checkpoint, save_checkpoint
from bagua_torch.checkpoint.files import TRACKER, checkpoint_file, expert_file, optimizer_file

__all__ = ["save_checkpoint", "load_checkpoint", "PreemptionGuard"]

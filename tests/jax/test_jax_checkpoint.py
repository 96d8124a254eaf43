"""bagua_jax.checkpoint (orbax underneath) across real processes (2 and 3):

* a run resumed from a checkpoint ends bitwise where the uninterrupted run
  ends (ByteGrad with error feedback, whose per-rank residual is in the
  state, and LowPrecisionDecentralized's replicas, both chained with adam);
* a damaged file of the newest step on one rank (altered, truncated,
  removed): every rank warns naming it and falls back to the step before;
* a step one rank never finished (no manifest: killed between orbax's write
  and the manifest) is not used; nothing saved: ``(None, target)``;
* ``keep_last`` keeps the newest steps; a rank that cannot write makes every
  rank raise OSError and keeps the earlier checkpoints;
* a SIGTERM to one rank (PreemptionGuard): every rank saves at the same step;
* a checkpoint saved by another number of ranks (a group one smaller, then
  the whole world): refused unless world_size_policy="from_rank0", which
  gives every rank rank 0's state;
* a target of another structure: RuntimeError on every rank;
* a process SIGKILLed while orbax writes: the next one loads the step before.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings

import numpy as np

from tests.harness.jax_worker import JaxWorker, worker_main
from tests.harness.mp import Session, session_tests
from tests.harness.worker import expect_error

SESSIONS = {"w2": 2, "w3": 3}
CASES = [
    "resume_is_bitwise",
    "damaged_newest_step_falls_back",
    "unfinished_step_and_nothing_saved",
    "keep_last_and_unwritable",
    "sigterm_saves_every_rank_at_the_same_step",
    "another_bucket_size",
    "another_world_size",
    "target_of_another_structure",
]
SHAPES = [(6, 5), (5,), (17,)]


class Worker(JaxWorker):
    def __init__(self):
        super().__init__()
        import bagua_jax
        from bagua_core import comm

        self.group = bagua_jax.init_process_group()
        self.root = comm.broadcast_object(tempfile.mkdtemp(prefix="bagua-jax-ckpt-") if self.rank == 0 else None, 0)

    def directory(self, case):
        return os.path.join(self.root, case)

    def params(self):
        return [self.jnp.asarray(np.full(s, 0.5, np.float32)) for s in SHAPES]

    def trainer(self, algorithm):
        """A jitted step of ``algorithm`` chained with adam, and its first state."""
        import bagua_jax

        jax, optax = self.jax, self.optax
        if algorithm == "bytegrad":
            tx = optax.chain(bagua_jax.transform(bagua_jax.ByteGradAlgorithm(error_feedback=True)), optax.adam(0.05))
        else:
            tx = optax.chain(optax.adam(0.05), bagua_jax.transform(bagua_jax.LowPrecisionDecentralizedAlgorithm()))

        def step(p, s, g):
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s

        params = self.params()
        return jax.jit(step), (params, tx.init(params))

    def train(self, step, state, start, stop):
        params, opt = state
        for t in range(start, stop):
            params, opt = step(params, opt, [self.jnp.asarray(g) for g in self.rank_grads(SHAPES, t)])
        return params, opt

    def assert_same(self, a, b):
        for x, y in zip(self.jax.tree_util.tree_leaves(a), self.jax.tree_util.tree_leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

    def saved_steps(self, case, steps):
        from bagua_jax.checkpoint import save_checkpoint

        step, state = self.trainer("bytegrad")
        states = {}
        for t in range(max(steps) + 1):
            if t in steps:
                save_checkpoint(self.directory(case), t, state)
                states[t] = state
            state = self.train(step, state, t, t + 1)
        return states

    # -- cases --
    def resume_is_bitwise(self):
        from bagua_jax.checkpoint import load_checkpoint, save_checkpoint

        for algorithm in ("bytegrad", "low_precision_decentralized"):
            directory = os.path.join(self.directory("resume"), algorithm)
            step, state = self.trainer(algorithm)
            state = self.train(step, state, 0, 3)
            save_checkpoint(directory, 3, state)
            uninterrupted = self.train(step, state, 3, 6)
            step, fresh = self.trainer(algorithm)  # a new process would start here
            at, restored = load_checkpoint(directory, fresh)
            assert at == 3
            self.assert_same(self.train(step, restored, 3, 6), uninterrupted)

    def damaged_newest_step_falls_back(self):
        from bagua_jax.checkpoint import load_checkpoint

        victim = self.world - 1
        for damage in ("altered", "truncated", "removed"):
            case = f"damaged-{damage}"
            states = self.saved_steps(case, (1, 2))
            if self.rank == victim:
                step_dir = os.path.join(self.directory(case), f"rank_{victim}", "2")
                path = max((os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs), key=os.path.getsize)
                if damage == "removed":
                    os.remove(path)
                else:
                    with open(path, "r+b") as f:
                        if damage == "altered":
                            first = f.read(1)
                            f.seek(0)
                            f.write(bytes([first[0] ^ 0x40]))
                        else:
                            f.truncate(os.path.getsize(path) // 2)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                at, restored = load_checkpoint(self.directory(case), self.trainer("bytegrad")[1])
            assert at == 1, (damage, at)
            self.assert_same(restored, states[1])
            messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
            assert any(f"step 2 on rank {victim}" in m and "falling back" in m for m in messages), messages

    def unfinished_step_and_nothing_saved(self):
        from bagua_jax.checkpoint import load_checkpoint

        target = self.trainer("bytegrad")[1]
        assert load_checkpoint(self.directory("nothing"), target) == (None, target)
        states = self.saved_steps("unfinished", (1, 2))
        if self.rank == 0:  # killed after orbax wrote step 2, before its manifest
            os.remove(os.path.join(self.directory("unfinished"), "rank_0", "2.manifest.json"))
        at, restored = load_checkpoint(self.directory("unfinished"), target)
        assert at == 1
        self.assert_same(restored, states[1])

    def keep_last_and_unwritable(self):
        from bagua_jax.checkpoint import load_checkpoint, save_checkpoint

        directory = self.directory("keep")
        step, state = self.trainer("bytegrad")
        for t in range(1, 5):
            save_checkpoint(directory, t, state, keep_last=2)
        mine = os.path.join(directory, f"rank_{self.rank}")
        assert sorted(os.listdir(mine)) == ["3", "3.manifest.json", "4", "4.manifest.json"], os.listdir(mine)
        in_the_way = os.path.join(mine, "5.manifest.json")
        if self.rank == 1:  # step 5's manifest cannot be written on this rank
            os.mkdir(in_the_way)
        expect_error(OSError, lambda: save_checkpoint(directory, 5, state, keep_last=2), "ranks [1]", "earlier")
        if self.rank == 1:
            os.rmdir(in_the_way)
        assert sorted(n for n in os.listdir(mine) if n.endswith(".json")) == [
            "3.manifest.json",
            "4.manifest.json",
        ] + (["5.manifest.json"] if self.rank != 1 else [])
        assert load_checkpoint(directory, state)[0] == 4  # the newest every rank finished

    def sigterm_saves_every_rank_at_the_same_step(self):
        import signal

        from bagua_jax.checkpoint import PreemptionGuard, load_checkpoint, save_checkpoint

        directory = self.directory("preempted")
        step, state = self.trainer("bytegrad")
        with PreemptionGuard() as guard:
            for t in range(20):
                state = self.train(step, state, t, t + 1)
                if self.rank == self.world - 1 and t == 3:  # the notice reaches one rank, mid-run
                    os.kill(os.getpid(), signal.SIGTERM)
                if guard.should_stop():
                    save_checkpoint(directory, t + 1, state)
                    break
        assert t == 3, t
        at, restored = load_checkpoint(directory, self.trainer("bytegrad")[1])
        assert at == 4
        self.assert_same(restored, state)

    def another_bucket_size(self):
        """Saved under 16-byte buckets (one per leaf), loaded into a
        transform of the default size (one bucket): the per-bucket state
        restores as saved, and training goes on exactly as from the state
        kept in memory (the first update lays it out for the new buckets)."""
        from bagua_jax.checkpoint import load_checkpoint, save_checkpoint

        directory = self.directory("bucket_size")
        os.environ["BAGUA_BUCKET_SIZE"] = "16"
        try:
            step, state = self.trainer("bytegrad")
        finally:
            del os.environ["BAGUA_BUCKET_SIZE"]
        state = self.train(step, state, 0, 3)
        save_checkpoint(directory, 3, state)
        step, fresh = self.trainer("bytegrad")
        assert len(fresh[1][0].step_state) == 1 < len(state[1][0].step_state)
        from_memory = self.train(step, state, 3, 6)
        at, restored = load_checkpoint(directory, fresh)
        assert at == 3
        self.assert_same(restored, state)
        self.assert_same(self.train(step, restored, 3, 6), from_memory)

    def another_world_size(self):
        """Saved by all ranks, loaded by all but the last (a sub-group), and
        saved by those, loaded by all: refused by default, naming both
        numbers; with world_size_policy="from_rank0" every rank gets rank
        0's state. A policy of another name is a ValueError."""
        import bagua_core
        from bagua_core import comm
        from bagua_jax.checkpoint import load_checkpoint, save_checkpoint

        fewer = bagua_core.new_group(list(range(self.world - 1)))
        target = {"x": self.jnp.zeros(3)}
        mine = {"x": self.jnp.full(3, float(self.rank + 1))}  # rank 0's is all 1.0
        shrink, grow = self.directory("shrink"), self.directory("grow")
        save_checkpoint(shrink, 5, mine)
        if fewer.is_member:
            save_checkpoint(grow, 7, mine, group=fewer)
            expect_error(ValueError, lambda: load_checkpoint(shrink, target, group=fewer), f"saved by {self.world} ")
            at, state = load_checkpoint(shrink, target, group=fewer, world_size_policy="from_rank0")
            assert at == 5 and np.asarray(state["x"]).tolist() == [1.0] * 3, (at, state)
        comm.barrier()  # the smaller group's step 7 is written
        expect_error(ValueError, lambda: load_checkpoint(grow, target), f"this group has {self.world}")
        at, state = load_checkpoint(grow, target, world_size_policy="from_rank0")
        assert at == 7 and np.asarray(state["x"]).tolist() == [1.0] * 3, (at, state)
        expect_error(ValueError, lambda: load_checkpoint(grow, target, world_size_policy="rank0"), "one of")

    def target_of_another_structure(self):
        from bagua_jax.checkpoint import load_checkpoint, save_checkpoint

        directory = self.directory("structure")
        save_checkpoint(directory, 1, {"w": self.jnp.ones(3)})
        expect_error(RuntimeError, lambda: load_checkpoint(directory, {"v": self.jnp.ones(4)}), "did not restore")
        from bagua_core import comm

        comm.barrier()  # every rank is done with the files
        if self.rank == 0:
            shutil.rmtree(self.root, ignore_errors=True)


test_case, test_session_exits_cleanly = session_tests(
    __file__,
    {name: Session(world) for name, world in SESSIONS.items()},
    lambda s: CASES,
    timeout=200,
    test_timeout=260,
    requires=("jax", "optax", "orbax.checkpoint"),
)

if __name__ == "__main__":
    worker_main(Worker, lambda s: CASES)


KILLED_WHILE_SAVING = """
import glob, os, signal, sys, threading, time
import jax.numpy as jnp, bagua_jax
from bagua_jax.checkpoint import save_checkpoint

bagua_jax.init_process_group()
directory, n = sys.argv[1], int(sys.argv[2])
state = {"w": jnp.arange(n, dtype=jnp.float32)}
save_checkpoint(directory, 1, state)

def kill_once_step_2_appears():  # orbax's temporary directory, or the step renamed before its manifest
    while not glob.glob(os.path.join(directory, "rank_0", "2*")):
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGKILL)

threading.Thread(target=kill_once_step_2_appears, daemon=True).start()
save_checkpoint(directory, 2, {"w": state["w"] + 1})
time.sleep(60)  # the kill comes first
"""

RESUMED = """
import sys
import numpy as np, jax.numpy as jnp, bagua_jax
from bagua_jax.checkpoint import load_checkpoint, save_checkpoint

bagua_jax.init_process_group()
directory, n = sys.argv[1], int(sys.argv[2])
step, state = load_checkpoint(directory, {"w": jnp.zeros(n, jnp.float32)})
assert step == 1, step
np.testing.assert_array_equal(np.asarray(state["w"]), np.arange(n, dtype=np.float32))
save_checkpoint(directory, 2, {"w": state["w"] + 1})  # over what the killed save left
assert load_checkpoint(directory, state)[0] == 2
print("RESUMED")
"""


def test_killed_while_saving_resumes_from_the_step_before(tmp_path):
    """A real SIGKILL in the middle of save_checkpoint (orbax writing 160 MB):
    the next process loads the step before, exactly, and can save over the
    leftovers."""
    import pytest

    from tests.harness import mp

    pytest.importorskip("orbax.checkpoint")
    args = [str(tmp_path), str(40_000_000)]
    killed = mp.launch(KILLED_WHILE_SAVING, 1, timeout=120, args=args)
    assert killed.workers[0].returncode == -9, killed.summary()
    resumed = mp.launch(RESUMED, 1, timeout=120, args=args)
    assert resumed.ok() and "RESUMED" in resumed.workers[0].stdout, resumed.summary()

"""Checkpoints a user can trust (bagua_torch.checkpoint), with real files and
real processes: whole-or-nothing writes (a process SIGKILLed in the middle
of a save leaves the previous checkpoint in use), verification on load
(truncated, empty and bit-flipped files fall back to the previous good
checkpoint with a warning; none left is an error naming each problem),
keep-the-last-K, random states restored, Bagua 0.9.2's checkpoints (no
manifest) still loading, a directory that cannot be written; on 2 and 3
ranks, a file damaged for one rank only makes every rank fall back to the
same iteration, a rank that cannot write makes every rank raise with the
tracker unchanged, and a SIGTERM to one rank (PreemptionGuard) gives one
checkpoint at the same step everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from bagua_torch.checkpoint import TRACKER, PreemptionGuard, load_checkpoint, save_checkpoint
from tests.harness.mp import REPO, session_tests
from tests.harness.torch_worker import TorchWorker, worker_main


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _saved(tmp_path, iterations=(3, 5)):
    """Checkpoints at ``iterations`` of models seeded by the iteration; returns their weights."""
    weights = {}
    for it in iterations:
        m = _model(it)
        opt = torch.optim.Adam(m.parameters(), lr=0.1)
        m(torch.randn(3, 4)).sum().backward()
        opt.step()
        save_checkpoint(it, str(tmp_path), m, opt)
        weights[it] = _flat(m)
    return weights


def _file(tmp_path, it, name="mp_rank_00_model_states.pt"):
    return tmp_path / f"iter_{it:07d}" / name


def test_round_trip_and_random_states(tmp_path):
    weights = _saved(tmp_path)
    after = torch.rand(5)  # what the saved run draws next
    fresh = _model(0)
    opt = torch.optim.Adam(fresh.parameters(), lr=0.1)
    assert load_checkpoint(str(tmp_path), fresh, opt) == 5
    assert torch.equal(_flat(fresh), weights[5]) and opt.state_dict()["state"]
    assert torch.equal(torch.rand(5), after), "the random state was not restored"
    names = sorted(p.name for p in (tmp_path / "iter_0000005").iterdir())
    assert names == ["manifest_rank_0.json", "mp_rank_00_model_states.pt", "rng_rank_0.pt"]
    assert (tmp_path / TRACKER).read_text() == "5"


@pytest.mark.parametrize(
    "damage,why",
    [
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "bytes, the manifest says"),
        (lambda p: p.write_bytes(b""), "has 0 bytes"),
        (lambda p: p.write_bytes(_flip(p.read_bytes())), "fails its checksum"),
        (lambda p: p.unlink(), "cannot be read"),
    ],
    ids=["truncated", "empty", "bit-flipped", "missing"],
)
def test_a_damaged_latest_checkpoint_falls_back_loudly(tmp_path, damage, why):
    weights = _saved(tmp_path)
    damage(_file(tmp_path, 5))
    fresh = _model(0)
    with pytest.warns(RuntimeWarning, match=why):
        assert load_checkpoint(str(tmp_path), fresh) == 3
    assert torch.equal(_flat(fresh), weights[3])
    damage(_file(tmp_path, 3))
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="no good checkpoint") as e:
        load_checkpoint(str(tmp_path), _model(0))
    assert "iteration 5:" in str(e.value) and "iteration 3:" in str(e.value)


def _flip(data: bytes) -> bytes:
    b = bytearray(data)
    b[len(b) // 2] ^= 0x10
    return bytes(b)


def test_the_sampler_position_goes_in(tmp_path):
    from bagua_torch.contrib import ResumableDistributedSampler

    data = list(range(40))
    sampler = ResumableDistributedSampler(data, num_replicas=4, rank=0, seed=1)
    sampler.set_epoch(2)
    for _ in range(3):
        sampler.advance(2)
    save_checkpoint(1, str(tmp_path), _model(1), sampler=sampler)
    resumed = ResumableDistributedSampler(data, num_replicas=3, rank=2, seed=1)  # another number of ranks
    load_checkpoint(str(tmp_path), _model(0), sampler=resumed)
    assert resumed.state_dict()["segments"] == [[24, 4]] and resumed.epoch == 2


def test_keep_last(tmp_path):
    for it in (1, 2, 3, 4):
        save_checkpoint(it, str(tmp_path), _model(it), keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000003", "iter_0000004", TRACKER]
    with pytest.raises(ValueError, match="keep_last"):
        save_checkpoint(5, str(tmp_path), _model(5), keep_last=0)


def test_bagua_0_9_checkpoints_load_with_a_warning(tmp_path):
    m = _model(7)
    (tmp_path / "iter_0000002").mkdir()
    torch.save({"iteration": 2, "model": m.state_dict()}, _file(tmp_path, 2))  # the original's file, nothing else
    (tmp_path / TRACKER).write_text("2")
    fresh = _model(0)
    with pytest.warns(RuntimeWarning, match="no manifest"):
        assert load_checkpoint(str(tmp_path), fresh) == 2
    assert torch.equal(_flat(fresh), _flat(m))


def test_a_garbage_tracker_falls_back_to_the_newest_good_iteration(tmp_path):
    weights = _saved(tmp_path)
    (tmp_path / TRACKER).write_text("\x00\x13garbage")
    fresh = _model(0)
    with pytest.warns(RuntimeWarning, match="not an iteration number"):
        assert load_checkpoint(str(tmp_path), fresh) == 5
    assert torch.equal(_flat(fresh), weights[5])


def test_a_directory_that_cannot_be_written(tmp_path):
    _saved(tmp_path, (3,))
    blocker = tmp_path / "iter_0000009"
    blocker.write_text("a file where the directory should go")
    with pytest.raises(OSError, match="save_checkpoint\\(9\\) failed on rank 0"):
        save_checkpoint(9, str(tmp_path), _model(9))
    assert (tmp_path / TRACKER).read_text() == "3"
    assert load_checkpoint(str(tmp_path), _model(0)) == 3


KILLED_MID_SAVE = """
import os, signal, sys
import torch
from bagua_torch.checkpoint import files, save_checkpoint

path = sys.argv[1]
torch.manual_seed(3)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
save_checkpoint(3, path, model)
real, calls = files.write_bytes, []

def dies_on_the_second_file(p, data):
    calls.append(p)
    if len(calls) == 2:  # iteration 5's first file is on disk, the rest is not
        with open(p + ".tmp", "wb") as f:
            f.write(data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return real(p, data)

files.write_bytes = dies_on_the_second_file
torch.manual_seed(5)
save_checkpoint(5, path, torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)))
"""


@pytest.mark.timeout(60)
def test_a_process_killed_mid_save_leaves_the_previous_checkpoint(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED_MID_SAVE))
    env = dict(os.environ, PYTHONPATH=REPO)
    got = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt")], env=env, capture_output=True, timeout=50
    )
    assert got.returncode == -9, got.stderr.decode()[-2000:]
    assert (tmp_path / "ckpt" / TRACKER).read_text() == "3"
    fresh = _model(0)
    assert load_checkpoint(str(tmp_path / "ckpt"), fresh) == 3
    assert torch.equal(_flat(fresh), _flat(_model(3)))


def test_per_rank_state_saved_by_more_ranks_loads_as_rank_0s_with_a_warning(tmp_path):
    import json

    weights = _saved(tmp_path, iterations=(3,))
    directory = tmp_path / "iter_0000003"
    torch.save(
        {"model": {k: torch.zeros_like(v) for k, v in _model(9).state_dict().items()}}, directory / "rank_1_states.pt"
    )
    (directory / "manifest_rank_1.json").write_text(json.dumps({"rank": 1, "files": {}}))  # as if 2 ranks wrote it
    fresh = _model(0)
    with pytest.warns(RuntimeWarning, match="per-rank state of 2 ranks and this job has 1: every rank takes rank 0's"):
        assert load_checkpoint(str(tmp_path), fresh) == 3
    assert torch.equal(_flat(fresh), weights[3])


def test_preemption_guard_alone():
    import signal

    with PreemptionGuard() as guard:
        assert not guard.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.should_stop()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with pytest.raises(ValueError, match="every"):
        PreemptionGuard(every=0)


# ---------------------------------------------------------------- several ranks

CASES = [
    "damaged_for_one_rank_falls_back_everywhere",
    "a_rank_that_cannot_write",
    "sigterm_to_one_rank",
    "per_rank_state_resumes_as_each_rank_saved_it",
]


class Worker(TorchWorker):
    def __init__(self):
        super().__init__()
        self.path = self.shared_tmpdir()

    def wrapped(self, seed, algorithm=None):
        m = _model(seed)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        return m.with_bagua([opt], algorithm or self.bt.algorithms.GradientAllReduceAlgorithm()), opt

    def train(self, m, opt, steps, start=0):
        for step in range(start, start + steps):
            g = torch.Generator().manual_seed(100 * step + self.rank)
            opt.zero_grad()
            m(torch.randn(6, 4, generator=g)).square().mean().backward()
            opt.step()

    def damaged_for_one_rank_falls_back_everywhere(self):
        import warnings

        path = os.path.join(self.path, "damaged")
        m, opt = self.wrapped(1)
        self.train(m, opt, 2)
        save_checkpoint(2, path, m, opt)
        at2 = _flat(m)
        self.train(m, opt, 2, start=2)
        save_checkpoint(4, path, m, opt)
        if self.rank == self.world - 1:  # only this rank reads its random states
            p = os.path.join(path, "iter_0000004", f"rng_rank_{self.rank}.pt")
            with open(p, "rb") as f:
                data = f.read()
            with open(p, "wb") as f:
                f.write(_flip(data))
        self.bt.barrier()
        fresh, fresh_opt = self.wrapped(0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert load_checkpoint(path, fresh, fresh_opt) == 2
        said = " ".join(str(w.message) for w in caught)
        assert "iter_0000004 is damaged" in said, said
        if self.rank == self.world - 1:
            assert "fails its checksum" in said, said
        assert torch.equal(_flat(fresh), at2)
        for x in (m, fresh):
            x.bagua_ddp.close()

    def a_rank_that_cannot_write(self):
        from bagua_torch.checkpoint import files

        path = os.path.join(self.path, "unwritable")
        m, opt = self.wrapped(2)
        save_checkpoint(1, path, m, opt)
        real = files.save
        if self.rank == 1:

            def no_space(obj, p):
                raise OSError(28, "No space left on device")

            files.save = no_space
        want = "failed on rank 1: [Errno 28] No space left" if self.rank == 1 else "failed on rank(s) [1]"
        try:
            self.expect_error(OSError, lambda: save_checkpoint(2, path, m, opt), want)
        finally:
            files.save = real
        with open(os.path.join(path, TRACKER)) as f:
            assert f.read() == "1"
        assert load_checkpoint(path, _model(0)) == 1
        m.bagua_ddp.close()

    def sigterm_to_one_rank(self):
        import signal

        path = os.path.join(self.path, "preempted")
        m, opt = self.wrapped(3)
        stopped = None
        with PreemptionGuard() as guard:
            for step in range(50):
                self.train(m, opt, 1, start=step)
                if self.rank == 1 and step == 6:
                    os.kill(os.getpid(), signal.SIGTERM)  # the notice reaches one rank, mid-run
                if guard.should_stop():
                    save_checkpoint(step + 1, path, m, opt)
                    stopped = step
                    break
        assert stopped == 6, stopped  # the same step on every rank
        everyone = self.bt.allgather(torch.tensor([float(stopped)]))
        assert torch.equal(everyone, torch.full((self.world, 1), 6.0))
        fresh, fresh_opt = self.wrapped(0)
        assert load_checkpoint(path, fresh, fresh_opt) == 7
        assert torch.equal(_flat(fresh), _flat(m))
        for x in (m, fresh):
            x.bagua_ddp.close()

    def per_rank_state_resumes_as_each_rank_saved_it(self):
        """ByteGrad's error-feedback residual differs per rank: every rank
        writes its own and takes it back, with its optimizer state."""
        path = os.path.join(self.path, "per_rank")

        def bytegrad():
            return self.bt.algorithms.ByteGradAlgorithm(error_feedback=True)

        m, opt = self.wrapped(4, bytegrad())
        self.train(m, opt, 3)
        save_checkpoint(3, path, m, opt)
        saved = m.bagua_ddp.state_dict()["state"]
        residual = saved["step_state"][0]
        everyone = self.bt.allgather(residual.reshape(1, -1).clone())
        assert not torch.equal(everyone[0], everyone[-1])  # the residuals differ per rank
        own = os.path.join(path, "iter_0000003", f"rank_{self.rank}_states.pt")
        assert os.path.exists(own) == (self.rank != 0)
        fresh, fresh_opt = self.wrapped(0, bytegrad())
        assert load_checkpoint(path, fresh, fresh_opt) == 3
        loaded = fresh.bagua_ddp.state_dict()["state"]
        assert len(loaded["step_state"]) == len(saved["step_state"])
        for a, b in zip(loaded["step_state"], saved["step_state"]):
            assert torch.equal(a, b)
        assert str(fresh_opt.state_dict()["state"]) == str(opt.state_dict()["state"])  # this rank's momentum
        for x in (m, fresh):
            x.bagua_ddp.close()


def case_names(session):
    return CASES


test_case, test_session_exits_cleanly = session_tests(__file__, {"w2": 2, "w3": 3}, case_names, timeout=120)

if __name__ == "__main__":
    worker_main(Worker, case_names)

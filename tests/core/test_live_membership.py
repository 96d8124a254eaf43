"""bagua_core.live on torchft's Lighthouse, below the frontends: an
unreachable Lighthouse and a quorum below ``--min_replicas`` are clear errors
within the timeout; a process of an older generation cannot enter the group
of a newer one, which goes on untouched. (Training through it, with kills:
tests/torch/test_live.py.)"""

from __future__ import annotations

import time

import pytest

from tests.harness import live, mp

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(live.LIGHTHOUSE is None, reason=live.NO_LIGHTHOUSE)]


@pytest.fixture
def lighthouse():
    port = mp.free_master_ports()
    proc = live.start_lighthouse(port)
    yield f"127.0.0.1:{port}"
    proc.kill()
    proc.wait()


def test_an_unreachable_lighthouse_is_a_clear_error_within_the_timeout():
    from bagua_core.errors import CommTimeoutError
    from bagua_core.live import Membership

    began = time.monotonic()
    with pytest.raises(CommTimeoutError, match="could not reach the Lighthouse at http://127.0.0.1:1 within 2 s"):
        Membership(lighthouse="127.0.0.1:1", timeout_s=2)
    assert time.monotonic() - began < 10


def test_no_lighthouse_named_is_a_clear_error(monkeypatch):
    from bagua_core.config import ConfigError
    from bagua_core.live import Membership

    monkeypatch.delenv("BAGUA_LIGHTHOUSE", raising=False)
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(ConfigError, match="set BAGUA_LIGHTHOUSE"):
        Membership()


def test_one_replica_below_min_replicas_gets_no_quorum(lighthouse):
    from bagua_core.errors import CommTimeoutError
    from bagua_core.live import Membership

    membership = Membership(lighthouse=lighthouse, timeout_s=2)
    try:
        began = time.monotonic()
        with pytest.raises(CommTimeoutError, match="at least its --min_replicas replicas alive"):
            membership.agree(0)
        assert time.monotonic() - began < 10
    finally:
        membership.close()


STALE = r"""
import dataclasses, os, time
import numpy as np
import bagua_core
from bagua_core import config
from bagua_core.live import Membership
from tests.harness.worker import report

rank, where = int(os.environ["RANK"]), os.environ["LIVE_DIR"]
if rank < 2:  # two members: one quorum, then a group of generation 1
    membership = Membership()
    agreement = membership.agree(0)
    membership.rebuild(agreement)
    if agreement.rank == 0:
        open(os.path.join(where, "%s_%d" % agreement.leader_store), "w").close()
    report("members", True, generation=agreement.generation, world=agreement.world_size)
    while not os.path.exists(os.path.join(where, "tried")):
        time.sleep(0.05)
    x = np.full(3, float(rank + 1))
    bagua_core.allreduce_inplace(x)
    report("untouched", True, sum=x.tolist())
    membership.close()
else:  # a process of generation 0 tries their store as rank 1
    while not [n for n in os.listdir(where) if "_" in n]:
        time.sleep(0.05)
    addr, port = [n for n in os.listdir(where) if "_" in n][0].split("_")
    settings = dataclasses.replace(config.load(), rank=1, world_size=2, master_addr=addr, store_port=int(port))
    try:
        bagua_core.init_process_group(settings, generation=0)
        report("stale", True, refused="")
    except RuntimeError as e:
        report("stale", True, refused=str(e))
    open(os.path.join(where, "tried"), "w").close()
"""


def test_a_stale_generation_is_refused_and_the_group_goes_on(lighthouse, tmp_path):
    """Ranks 0 and 1 agree (generation 1); process 2 never asks for a quorum
    and tries their store as rank 1 of generation 0."""
    env = {"BAGUA_LIGHTHOUSE": lighthouse, "LIVE_DIR": str(tmp_path), "BAGUA_TIMEOUT": "20"}
    run = mp.launch(STALE, 3, timeout=60, env=env)
    run.check()
    cases = run.cases()
    assert {r["generation"] for r in cases["members"].values()} == {1}
    assert "initialisation 1 but this process at 0" in cases["stale"][2]["refused"]
    assert cases["untouched"][0]["sum"] == [3.0, 3.0, 3.0] == cases["untouched"][1]["sum"]

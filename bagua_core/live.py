"""Per-step fault tolerance: members agree on who trains, and the world group
is rebuilt for each new membership without restarting the survivors.

The membership service is torchft's Lighthouse (the ``torchft_lighthouse``
command; docs/fault-tolerance.md says why it and not torch elastic's store).
Each member is one process (a *replica*): it heartbeats to the Lighthouse from
a thread and asks it for a quorum once per attempt of a step
(:meth:`Membership.agree`). The Lighthouse gives every member the same list of
participants once all members of the previous quorum have asked, or, when one
is missing, once its heartbeat has stopped (``--heartbeat_timeout_ms``); a
replica that starts (or restarts) is taken in at the next quorum. It forms no
quorum below its ``--min_replicas`` and none without a majority of the
replicas it hears from, so the two halves of a split job never both train.

From one answer every member computes the same :class:`Agreement`: the ranks
(members at the highest committed step first, then by replica id, so rank 0
holds the newest state and is the one the others heal from), whether the world
group must be rebuilt (a member joined or was lost, or one member's group broke
in its last attempt) and the rebuilt group's *generation*, one more than the
highest any member has seen. The generation is the rendezvous store's
(:mod:`bagua_core.rendezvous`): a process of an older generation cannot enter
the new group's store (a ``RuntimeError`` on that process; the group is not
touched). :meth:`Membership.rebuild` closes the old world group and starts the
new one (rank 0 hosts the store at the address it advertised).

:class:`LiveLoop` is the training loop's side, the same in both frameworks:
one quorum per attempt of a step, a rebuild when the members changed or one
of them failed, a lost peer inside the attempt swallowed (the step runs again
on the new membership). The frontends (``bagua_torch.live``,
``bagua_jax.live``) close what they built on the old group before a rebuild
and heal from rank 0 after it.

One process per replica; a replica of several processes (a node's GPUs as one
replica) is not built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, Iterator, List, Optional, Tuple

from bagua_core import config, log, process_group
from bagua_core.errors import CommTimeoutError, PeerError
from bagua_core.launcher.ports import free_master_ports
from bagua_core.rendezvous import _local_address


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What one quorum means for this member.

    ``members``: replica ids in rank order; ``steps``: each one's committed
    step; ``rank`` / ``world_size``: this member's place; ``rebuild``: the
    world group must be rebuilt (then ``generation`` is the new group's);
    ``leader_store``: where rank 0 hosts the rebuilt group's store.
    """

    quorum_id: int
    members: Tuple[str, ...]
    steps: Tuple[int, ...]
    rank: int
    rebuild: bool
    generation: int
    leader_store: Tuple[str, int]

    @property
    def world_size(self) -> int:
        return len(self.members)


class Membership:
    """This process's membership of a live job (see the module docstring).

    ``lighthouse``: the Lighthouse's address (default ``BAGUA_LIGHTHOUSE``);
    ``replica_id``: unique per process start (default: host, pid and a random
    suffix); ``timeout_s``: how long a quorum and a rebuild may take (default
    ``BAGUA_TIMEOUT``); ``heartbeat_interval_s``: between two heartbeats (keep
    it well under the Lighthouse's ``--heartbeat_timeout_ms``).
    """

    def __init__(
        self,
        lighthouse: Optional[str] = None,
        replica_id: Optional[str] = None,
        timeout_s: Optional[float] = None,
        heartbeat_interval_s: float = 0.1,
    ):
        from bagua_core._torchft import extension

        self._settings = config.load()
        self.lighthouse = lighthouse or self._settings.lighthouse
        if not self.lighthouse:
            raise config.ConfigError(
                "per-step fault tolerance needs a Lighthouse: set BAGUA_LIGHTHOUSE=HOST:PORT "
                "(start one with: torchft_lighthouse --min_replicas N)"
            )
        if "://" not in self.lighthouse:
            self.lighthouse = "http://" + self.lighthouse
        self.replica_id = replica_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.timeout_s = float(timeout_s if timeout_s is not None else self._settings.timeout_s)
        host = self.lighthouse.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
        self.host = self._settings.hostname or _local_address(host)
        self._ext = extension()
        try:
            self._client = self._ext.LighthouseClient(self.lighthouse, timedelta(seconds=self.timeout_s))
        except Exception as e:  # torchft raises RuntimeError with the transport's text
            raise CommTimeoutError(
                f"could not reach the Lighthouse at {self.lighthouse} within {self.timeout_s:g} s ({e}); "
                "is torchft_lighthouse running there (BAGUA_LIGHTHOUSE)?"
            ) from e
        self.generation = 0  # of the group this process is in; 0: none yet
        self.quorum_id: Optional[int] = None
        self.agreement: Optional[Agreement] = None
        self._stop = threading.Event()
        self._heartbeat_error: Optional[BaseException] = None
        self._heartbeat = threading.Thread(
            target=self._beat, args=(heartbeat_interval_s,), name="bagua-heartbeat", daemon=True
        )
        self._heartbeat.start()

    def _beat(self, interval_s: float) -> None:
        client = self._ext.LighthouseClient(self.lighthouse, timedelta(seconds=self.timeout_s))
        while not self._stop.wait(interval_s):
            try:
                client.heartbeat(self.replica_id, timedelta(seconds=max(1.0, 10 * interval_s)))
                self._heartbeat_error = None
            except Exception as e:  # noqa: BLE001 - the Lighthouse away for a while: the quorum call reports it
                if self._heartbeat_error is None:
                    log.logger.warning("bagua: heartbeat to the Lighthouse %s failed: %s", self.lighthouse, e)
                self._heartbeat_error = e

    def agree(self, step: int, broken: bool = False) -> Agreement:
        """One quorum: every member calls it once per attempt, with its
        committed ``step`` and whether its group broke in the last attempt."""
        port = free_master_ports() + 1  # the store's, should this member be rank 0 (p + 1: as launchers do)
        data = {"generation": self.generation, "broken": bool(broken or self.generation == 0)}
        try:
            quorum = self._client.quorum(
                replica_id=self.replica_id,
                timeout=timedelta(seconds=self.timeout_s),
                address=self.host,
                store_address=f"{self.host}:{port}",
                step=int(step),
                world_size=1,
                shrink_only=False,
                data=data,
            )
        except Exception as e:  # the client raises TimeoutError or RuntimeError, with gRPC's text
            raise CommTimeoutError(
                f"no quorum from the Lighthouse {self.lighthouse} within {self.timeout_s:g} s ({e}); "
                "is it running, and are at least its --min_replicas replicas alive?"
            ) from e
        members = sorted(quorum.participants, key=lambda p: (-p.step, p.replica_id))
        ids = tuple(p.replica_id for p in members)
        rebuild = quorum.quorum_id != self.quorum_id or any(p.data["broken"] for p in members)
        leader = members[0].store_address.rsplit(":", 1)
        agreement = Agreement(
            quorum_id=quorum.quorum_id,
            members=ids,
            steps=tuple(p.step for p in members),
            rank=ids.index(self.replica_id),
            rebuild=rebuild,
            generation=max(p.data["generation"] for p in members) + 1 if rebuild else self.generation,
            leader_store=(leader[0].strip("[]"), int(leader[1])),
        )
        self.agreement = agreement
        return agreement

    def rebuild(self, agreement: Agreement) -> process_group.ProcessGroup:
        """Closes the old world group and joins the agreed one. Everything
        built on the old group (wrapped models, engines) must be closed first."""
        process_group.destroy_process_group()
        self.generation = 0  # until the new group stands: a failure here leaves this process broken
        addr, port = agreement.leader_store
        settings = dataclasses.replace(
            self._settings,
            rank=agreement.rank,
            world_size=agreement.world_size,
            local_rank=0,
            local_world_size=1,
            node_rank=agreement.rank,
            master_addr=addr,
            master_port=port - 1,
            store_port=port,
            timeout_s=self.timeout_s,
            launched=True,
        )
        group = process_group.init_process_group(settings, generation=agreement.generation)
        self.generation = agreement.generation
        self.quorum_id = agreement.quorum_id
        log.logger.warning(
            "bagua: rank %d of %d in generation %d (members %s)",
            agreement.rank,
            agreement.world_size,
            agreement.generation,
            list(agreement.members),
        )
        return group

    def close(self) -> None:
        """Stops the heartbeat (the Lighthouse then drops this replica) and
        closes the world group."""
        self._stop.set()
        self._heartbeat.join(timeout=5)
        process_group.destroy_process_group()


class LiveLoop:
    """The attempts of a live training loop (see the module docstring); a
    frontend subclasses it with :meth:`_before_rebuild` and :meth:`_after_rebuild`.

    Attributes: ``step`` (committed steps), ``membership``, ``changes`` (one
    ``(step, world_size, generation, time)`` per rebuilt group, ``time`` when
    it was ready, from ``time.time()``), ``failures`` (attempts that lost a
    peer). ``max_failures`` failed attempts in a row raise the last error.
    """

    def __init__(
        self,
        lighthouse: Optional[str] = None,
        replica_id: Optional[str] = None,
        timeout_s: Optional[float] = None,
        max_failures: int = 3,
    ):
        self.max_failures = int(max_failures)
        self.membership = Membership(lighthouse=lighthouse, replica_id=replica_id, timeout_s=timeout_s)
        self.step = 0
        self.changes: List[tuple] = []
        self.failures = 0
        self._failed_in_a_row = 0
        self._broken = False

    @property
    def rank(self) -> int:
        return process_group.get_rank()

    @property
    def world_size(self) -> int:
        return process_group.get_world_size()

    @property
    def generation(self) -> int:
        return self.membership.generation

    @contextlib.contextmanager
    def attempt(self) -> Iterator[Any]:
        """One try of step ``self.step`` on the agreed membership; the step
        counts when the block ends without error. A lost peer inside it
        (:meth:`_lost_peer`) ends the block without raising."""
        agreement = self.membership.agree(self.step, broken=self._broken)
        if agreement.rebuild:
            began = time.monotonic()
            kept = self._before_rebuild(agreement)
            self.membership.rebuild(agreement)
            self._after_rebuild(agreement, kept)
            self._broken = False
            self.changes.append((self.step, agreement.world_size, agreement.generation, time.time()))
            log.logger.info("bagua: group of %d rebuilt in %.3f s", agreement.world_size, time.monotonic() - began)
        try:
            yield self
            self._finish_attempt()
        except Exception as e:
            if not self._lost_peer(e):
                raise
            self._failed_attempt()
            self.failures += 1
            self._failed_in_a_row += 1
            self._broken = True
            if self._failed_in_a_row >= self.max_failures:
                raise
            log.logger.warning("bagua: step %d lost a peer (%s); agreeing on the members again", self.step, e)
            return
        self.step += 1
        self._failed_in_a_row = 0

    def _lost_peer(self, error: BaseException) -> bool:
        """Whether ``error`` means a peer was lost (the attempt is then retried)."""
        return isinstance(error, (PeerError, CommTimeoutError))

    def _finish_attempt(self) -> None:
        """Inside the attempt, after its block: waits for what may still fail."""

    def _failed_attempt(self) -> None:
        """After an attempt that lost a peer: undoes what it left half done."""

    def _before_rebuild(self, agreement: Agreement) -> Any:
        """Closes what was built on the old group; returns what rank 0 keeps for the others."""
        return None

    def _after_rebuild(self, agreement: Agreement, kept: Any) -> None:
        """Heals from rank 0 (``self.step`` included) and builds on the new group."""

    def close(self) -> None:
        """Leaves the membership and closes the group."""
        self.membership.close()

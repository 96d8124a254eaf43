"""A process group's communicators as Bagua 0.9.2 showed them.

Contract: ``group.get_global_communicator()``, ``get_inter_node_communicator()``
and ``get_intra_node_communicator()`` return a :class:`GroupCommunicator`
with ``rank()`` and ``nranks()`` (``rank()`` is -1 where this process is not
a member); every primitive of :mod:`bagua_core.comm` (and of the frontends)
accepts one wherever it accepts a group, and then runs on the group it
stands for: the group itself, its inter-node group (one rank per node) or
its intra-node group (this node's ranks). A primitive on a communicator this
process is not a member of returns at once, as on a non-member group.

The inter- and intra-node groups connect on first use, so the first call of
``get_inter_node_communicator()`` / ``get_intra_node_communicator()`` on a
group is made by every member of that group, in the same order.
"""

from __future__ import annotations

KINDS = ("global", "inter", "intra")


class GroupCommunicator:
    """One of a group's three communicators (see the module docstring)."""

    __slots__ = ("group", "kind")

    def __init__(self, group, kind: str):
        if kind not in KINDS:
            raise ValueError(f"comm_name should be one of {list(KINDS)}, got {kind!r}")
        self.group = group  # the ProcessGroup the primitives run on
        self.kind = kind

    def rank(self) -> int:
        """This process's rank in the communicator (-1 when not a member)."""
        return self.group.rank

    def nranks(self) -> int:
        return self.group.size

    @property
    def is_member(self) -> bool:
        return self.group.is_member

    def __eq__(self, other) -> bool:
        return isinstance(other, GroupCommunicator) and (other.group, other.kind) == (self.group, self.kind)

    def __hash__(self) -> int:
        return hash((id(self.group), self.kind))

    def __repr__(self) -> str:
        return f"<GroupCommunicator {self.kind} of {self.group!r}>"

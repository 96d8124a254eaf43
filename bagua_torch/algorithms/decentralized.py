"""Decentralized SGD: weights averaged with peers concurrently with forward and
backward; the average replaces the weights before the optimizer step, which
then applies the local gradient: x_{t+1} = avg(x_t) - lr * g(x_t)."""

from __future__ import annotations

from bagua_core import algorithms as core
from bagua_torch.algorithms.base import Algorithm, AlgorithmImpl


class DecentralizedAlgorithmImpl(AlgorithmImpl):
    communicates = "weights"

    def check(self) -> None:
        d = self.description
        g = self.process_group
        peers = g.size
        if d.hierarchical and d.peer_selection_mode == "shift_one":
            peers = g.size // g.intra_node_group().size
        d.check_peers(peers)

    def one_bucket_per_dtype(self) -> bool:
        return True

    def append_ops(self, bucket) -> None:
        d = self.description
        self.ops.append(bucket.append_decentralized(peer_selection_mode=d.peer_selection_mode,
                                                    communication_interval=d.communication_interval,
                                                    hierarchical=d.hierarchical))

    def __init__(self, algorithm, process_group):
        super().__init__(algorithm, process_group)
        self.ops = []

    # The weights are handed to the engine as forward starts; the op copies
    # them and averages the copy on the comm thread while forward and backward
    # read the weights.
    def on_forward_start(self, ddp) -> None:
        ddp.copy_weights_to_slots()
        ddp.engine.mark_all_ready()
        ddp.step_pending = True

    def on_gradient_ready(self, ddp, name: str) -> None:
        pass  # gradients stay local

    def on_backward_end(self, ddp) -> None:
        ddp.finish_step()

    def after_wait(self, ddp) -> None:
        copied = [op.copy_back() for op in self.ops]
        if any(copied):
            ddp.copy_slots_to_weights()

    @property
    def step(self) -> int:
        """Training steps the averaging op has seen (its communication counter)."""
        return self.ops[0].step if self.ops else 0


class DecentralizedAlgorithm(Algorithm):
    """Decentralized synchronous SGD, full precision.

    Args:
        hierarchical: average within each node first; exchange between node
            leaders only.
        peer_selection_mode: "all" (global average of the weights) or
            "shift_one" (one partner per communication, rotating; needs an
            even number of peers).
        communication_interval: communicate every this many steps.
    """

    core_type = core.Decentralized
    impl_type = DecentralizedAlgorithmImpl

    def __init__(self, hierarchical: bool = True, peer_selection_mode: str = "all",
                 communication_interval: int = 1):
        super().__init__(hierarchical=hierarchical, peer_selection_mode=peer_selection_mode,
                         communication_interval=communication_interval)

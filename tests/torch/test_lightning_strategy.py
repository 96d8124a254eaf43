"""``bagua_torch.lightning.BaguaStrategy`` in a real Lightning ``Trainer`` on 2
processes: GradientAllReduce ends with the same weights as Lightning's own DDP
strategy (the reference, fitted in the same processes), ByteGrad keeps every
rank identical, decentralized and low-precision decentralized train, QAdam
takes its optimizer from ``configure_optimizers`` (and refuses another one),
async ends with equal weights on every rank, and ``strategy="bagua"`` resolves
by name. Skipped when
Lightning is not installed (``make deps`` installs it)."""

from __future__ import annotations

import os

import pytest

from tests.harness.mp import launch


def worker():
    import warnings

    import lightning.pytorch as pl
    import torch

    import bagua_torch
    from bagua_torch.lightning import BaguaStrategy

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)

    class Boring(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.layer(x), y)
            self.log("loss", loss, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    class BoringQAdam(Boring):
        def configure_optimizers(self):
            from bagua_torch.algorithms.q_adam import QAdamOptimizer

            return QAdamOptimizer(self.parameters(), lr=0.01, warmup_steps=4)

    def fit(strategy, module=Boring):
        torch.manual_seed(13)
        model = module()
        g = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(96, 32, generator=g), torch.randint(0, 2, (96,), generator=g))
        trainer = pl.Trainer(
            strategy=strategy,
            accelerator="cpu",
            devices=2,
            max_epochs=2,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))
        assert trainer.global_step == 2 * 96 // (2 * 4), trainer.global_step
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), trainer

    bagua_ga, trainer = fit(BaguaStrategy(algorithm="gradient_allreduce"))
    assert isinstance(trainer.strategy, BaguaStrategy)
    ddp, _ = fit("ddp")
    assert torch.allclose(bagua_ga, ddp, rtol=1e-5, atol=1e-6), (bagua_ga - ddp).abs().max()
    w, _ = fit(BaguaStrategy(algorithm="bytegrad"))
    allv = bagua_torch.allgather(w)
    assert torch.equal(allv[0], allv[1])  # the same decompressed gradients everywhere
    assert (w - ddp).abs().max() < 0.1  # close to DDP's: the compression error is small
    w, _ = fit(BaguaStrategy(algorithm="decentralized", hierarchical=False))
    assert torch.isfinite(w).all()
    w, _ = fit(BaguaStrategy(algorithm="low_precision_decentralized", hierarchical=False))
    assert torch.isfinite(w).all()
    w, trainer = fit(BaguaStrategy(algorithm="qadam", hierarchical=False), module=BoringQAdam)
    assert type(trainer.strategy.bagua_algorithm).__name__ == "QAdamAlgorithm"
    allv = bagua_torch.allgather(w)
    assert torch.equal(allv[0], allv[1])  # every step averages the (compressed) momentum: ranks step alike
    try:
        fit(BaguaStrategy(algorithm="qadam"))  # SGD from configure_optimizers
        raise AssertionError("qadam with an SGD optimizer was accepted")
    except ValueError as e:
        assert "exactly one QAdamOptimizer" in str(e), e
    w, _ = fit(BaguaStrategy(algorithm="async", sync_interval_ms=5))
    allv = bagua_torch.allgather(w)
    assert torch.equal(allv[0], allv[1])  # teardown aborts: a last average leaves the ranks equal
    by_name, trainer = fit("bagua")
    assert isinstance(trainer.strategy, BaguaStrategy) and torch.allclose(by_name, ddp, rtol=1e-5, atol=1e-6)
    print("LIGHTNING-OK")


@pytest.mark.timeout(300)
def test_bagua_strategy_in_a_lightning_trainer():
    pytest.importorskip("lightning")
    run = launch(os.path.abspath(__file__), 2, timeout=240)
    assert run.ok() and all("LIGHTNING-OK" in w.stdout for w in run.workers), run.summary()


def test_algorithm_checked_when_the_strategy_is_made():
    pytest.importorskip("lightning")
    from bagua_torch.lightning import BaguaStrategy

    with pytest.raises(KeyError, match="unknown algorithm 'nope'"):
        BaguaStrategy(algorithm="nope")
    with pytest.raises(TypeError, match="not the class"):
        from bagua_torch.algorithms import ByteGradAlgorithm

        BaguaStrategy(algorithm=ByteGradAlgorithm)
    assert BaguaStrategy(algorithm="bytegrad", hierarchical=False).bagua_algorithm.hierarchical is False


if __name__ == "__main__":
    worker()

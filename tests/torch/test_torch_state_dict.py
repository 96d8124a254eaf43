"""bagua_torch.DistributedDataParallel's state dict across real processes, for
every algorithm at world sizes 2 and 3:

* it holds tensors only (``module.*`` and the algorithm's ``bagua.*``
  entries), so ``{k: v.clone() for k, v in sd.items()}`` and ``torch.save`` /
  ``torch.load`` (weights only) work, and its entries are those of
  ``bagua_ddp.state_dict()``;
* saved mid-training, loaded (strict and not) into a fresh wrapper with other
  weights, the same further steps give bitwise the weights and state of the
  uninterrupted run; without the ``bagua.*`` entries, the algorithms whose
  state decides their steps (Decentralized with communication_interval 2,
  LowPrecisionDecentralized's replicas, ByteGrad's error-feedback residual,
  LocalSteps' anchor and outer momentum, plain and compressed with its
  residual, Async's warm-up) end elsewhere;
* torch DDP's and Bagua 0.9.2's state dicts (``module.*`` only) load, and so
  does the nested ``"bagua"`` entry earlier versions saved; a state of
  another algorithm and malformed entries raise; ``with_bagua``'s module
  state dict stays the plain model's.

One multi-process session per world size runs every case (this file is also
the worker script); pytest reports each case on its own.
"""

from __future__ import annotations

from tests.harness.mp import Session, session_tests
from tests.harness.torch_worker import TorchWorker, worker_main

SESSIONS = {"w2": 2, "w3": 3}
ALGORITHMS = [
    "gradient_allreduce",
    "bytegrad",
    "bytegrad_error_feedback",
    "decentralized",
    "low_precision_decentralized",
    "qadam",
    "async_model_average",
    "local_steps",
    "local_steps_compressed",
]
# algorithms whose saved state changes what the next steps do
STATE_MATTERS = {
    "bytegrad_error_feedback",
    "decentralized",
    "low_precision_decentralized",
    "async_model_average",
    "local_steps",
    "local_steps_compressed",
}
# those whose engine step keeps per-bucket state (bagua.step_state.<i>)
STEP_STATE = {
    "bytegrad_error_feedback",
    "low_precision_decentralized",
    "qadam",
    "local_steps",
    "local_steps_compressed",
}
BEFORE, AFTER = 3, 4  # steps before the save, and after it
NEVER_MS = 10**7  # Async's sync interval: averaging rounds only at abort()


def case_names(session: str):
    names = []
    for a in ALGORITHMS:
        names += [f"tensors_only_{a}", f"resumes_bitwise_{a}"]
    return names + [
        "torch_ddp_state_dict_loads",
        "bagua_0_9_2_state_dict_loads",
        "nested_entry_of_earlier_versions_loads",
        "other_algorithm_raises",
        "malformed_entries_raise",
        "with_bagua_state_dict_stays_plain",
    ]


class Worker(TorchWorker):
    def algorithm(self, name, model):
        """(optimizer, algorithm) of ``name``, set so that its state matters."""
        A, torch = self.A, self.torch
        if name == "qadam":
            opt = A.QAdamOptimizer(model.parameters(), lr=0.01, warmup_steps=2)  # the save comes after the switch
            return opt, A.QAdamAlgorithm(opt, hierarchical=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return opt, {
            "gradient_allreduce": lambda: A.GradientAllReduceAlgorithm(),
            "bytegrad": lambda: A.ByteGradAlgorithm(hierarchical=False),
            "bytegrad_error_feedback": lambda: A.ByteGradAlgorithm(hierarchical=False, error_feedback=True),
            "decentralized": lambda: A.DecentralizedAlgorithm(hierarchical=False, communication_interval=2),
            "low_precision_decentralized": lambda: A.LowPrecisionDecentralizedAlgorithm(hierarchical=False),
            # the save falls between two synchronisations: the anchor and the outer momentum matter
            "local_steps": lambda: A.LocalStepsAlgorithm(sync_interval=2),
            # and the residual of the compressed synchronisation before the save
            "local_steps_compressed": lambda: A.LocalStepsAlgorithm(
                sync_interval=2, compression="minmax_uint8", error_feedback=True
            ),
            # the warm-up ends after the save: a resumed run must know how far it got
            "async_model_average": lambda: A.AsyncModelAverageAlgorithm(
                sync_interval_ms=NEVER_MS, warmup_steps=BEFORE + 2
            ),
        }[name]()

    def wrapped(self, name, seed):
        model = self.mlp(seed)
        opt, algo = self.algorithm(name, model)
        return model, opt, self.bt.DistributedDataParallel(model, [opt], algorithm=algo)

    def train(self, ddp, opt, steps):
        for step in steps:
            x, y = self.batch(step)
            opt.zero_grad()
            self.torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()

    def end(self, ddp):
        """Ends training: Async's loop stops (a last averaging round)."""
        algo = ddp.bagua_algorithm.algorithm
        if isinstance(algo, self.A.AsyncModelAverageAlgorithm):
            algo.abort(ddp)

    def assert_same_state(self, got, expected):
        torch = self.torch
        assert list(got) == list(expected), (list(got), list(expected))
        for k in expected:
            assert got[k].dtype == expected[k].dtype and torch.equal(got[k], expected[k]), k

    # -- tensors only --
    def _tensors_only(self, name):
        import io

        torch = self.torch
        model, opt, ddp = self.wrapped(name, 7)
        self.train(ddp, opt, range(BEFORE))
        sd = ddp.state_dict()
        assert all(isinstance(v, torch.Tensor) for v in sd.values()), {k: type(v) for k, v in sd.items()}
        cloned = {k: v.clone() for k, v in sd.items()}  # what torch code does with a state dict
        inner = ddp.inner.state_dict()  # the same values, as a dict
        expected = {"module." + k for k in model.state_dict()} | {"bagua.algorithm"}
        if "step" in inner["state"]:
            expected.add("bagua.step")
            assert sd["bagua.step"].dtype == torch.int64 and sd["bagua.step"].dim() == 0
            assert int(sd["bagua.step"]) == inner["state"]["step"] == BEFORE, (sd["bagua.step"], inner)
        for i, t in enumerate(inner["state"].get("step_state", [])):
            expected.add(f"bagua.step_state.{i}")
            assert torch.equal(sd[f"bagua.step_state.{i}"], t)
        assert set(sd) == expected, sorted(set(sd) ^ expected)
        assert sd["bagua.algorithm"].dtype == torch.uint8
        name_saved = bytes(sd["bagua.algorithm"].tolist()).decode()
        assert name_saved == inner["algorithm"] == ddp.bagua_algorithm.algorithm.name, name_saved
        assert ("bagua.step_state.0" in sd) == (name in STEP_STATE), sorted(sd)
        buf = io.BytesIO()
        torch.save(cloned, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=True)
        self.assert_same_state(loaded, sd)
        assert not ddp.load_state_dict(loaded).missing_keys
        self.assert_same_state(ddp.state_dict(), sd)
        self.end(ddp)
        ddp.close()

    # -- save, continue; load into a fresh wrapper, continue the same --
    def _resumes_bitwise(self, name):
        import copy

        torch = self.torch
        model, opt, ddp = self.wrapped(name, 5)
        self.train(ddp, opt, range(BEFORE))
        saved = {k: v.clone() for k, v in ddp.state_dict().items()}
        saved_opt = copy.deepcopy(opt.state_dict())
        self.train(ddp, opt, range(BEFORE, BEFORE + AFTER))
        self.end(ddp)
        expected, expected_sd = self.flat(model), ddp.state_dict()
        ddp.close()

        plain = {k: v for k, v in saved.items() if not k.startswith("bagua.")}
        for entries, strict in ((saved, True), (saved, False), (plain, True)):
            model2, opt2, ddp2 = self.wrapped(name, 6)  # other weights: everything must come from the checkpoint
            result = ddp2.load_state_dict(entries, strict=strict)
            assert not result.missing_keys and not result.unexpected_keys, result
            opt2.load_state_dict(copy.deepcopy(saved_opt))  # torch keeps the tensors it is given
            self.train(ddp2, opt2, range(BEFORE, BEFORE + AFTER))
            self.end(ddp2)
            got = self.flat(model2)
            if entries is saved:
                assert torch.equal(got, expected), (
                    f"strict={strict}: max abs difference {(got - expected).abs().max().item():.3g}"
                )
                self.assert_same_state(ddp2.state_dict(), expected_sd)
            elif name in STATE_MATTERS:  # the test would not see a state left behind
                assert not torch.equal(got, expected), "the algorithm's state made no difference"
            ddp2.close()

    # -- other state dicts --
    def torch_ddp_state_dict_loads(self):
        torch = self.torch
        ref = torch.nn.parallel.DistributedDataParallel(self.mlp(8))
        sd = ref.state_dict()
        assert all(k.startswith("module.") for k in sd)
        model, opt, ddp = self.wrapped("low_precision_decentralized", 9)
        self.train(ddp, opt, range(2))
        replicas = ddp.inner.state_dict()["state"]["step_state"][0]
        for strict in (True, False):
            result = ddp.load_state_dict(sd, strict=strict)
            assert not result.missing_keys and not result.unexpected_keys, result
            assert torch.equal(self.flat(model), self.flat(ref.module))
            assert ddp.bagua_algorithm.step == 2  # the algorithm's state stays as it is
            assert torch.equal(ddp.inner.state_dict()["state"]["step_state"][0], replicas)
        # and the other way: torch DDP takes Bagua's state dict, without the bagua.* entries
        ours = ddp.state_dict()
        result = ref.load_state_dict(ours, strict=False)
        assert sorted(result.unexpected_keys) == sorted(k for k in ours if k.startswith("bagua.")), result
        ddp.close()

    def bagua_0_9_2_state_dict_loads(self):
        import bagua.torch_api as bagua

        torch = self.torch
        source = self.mlp(10)
        original = {"module." + k: v.clone() for k, v in source.state_dict().items()}  # as Bagua 0.9.2 saved it
        model = self.mlp(11)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        algo = bagua.algorithms.decentralized.DecentralizedAlgorithm(hierarchical=False)
        ddp = bagua.data_parallel.DistributedDataParallel(model, optimizers=[opt], algorithm=algo)
        assert isinstance(ddp, bagua.data_parallel.DistributedDataParallel_V1_9_0)
        self.train(ddp, opt, range(2))
        assert not ddp.load_state_dict(original).missing_keys
        assert torch.equal(self.flat(model), self.flat(source)) and ddp.bagua_algorithm.step == 2
        sd = ddp.state_dict()
        assert all(isinstance(v, torch.Tensor) for v in sd.values()) and int(sd["bagua.step"]) == 2
        ddp.close()

    def nested_entry_of_earlier_versions_loads(self):
        model, opt, ddp = self.wrapped("decentralized", 12)
        sd = {k: v for k, v in ddp.state_dict().items() if not k.startswith("bagua.")}
        sd["bagua"] = {"algorithm": "decentralized", "state": {"step": 5}}
        assert not ddp.load_state_dict(sd).unexpected_keys
        assert ddp.bagua_algorithm.step == 5
        ddp.close()

    def other_algorithm_raises(self):
        torch = self.torch
        model, opt, ddp = self.wrapped("decentralized", 13)
        self.train(ddp, opt, range(3))
        sd = ddp.state_dict()
        ddp.close()
        for other in ("gradient_allreduce", "low_precision_decentralized"):
            model2, opt2, ddp2 = self.wrapped(other, 14)
            self.train(ddp2, opt2, range(1))
            before = ddp2.inner.state_dict()
            for strict in (True, False):
                self.expect_error(
                    RuntimeError,
                    lambda: ddp2.load_state_dict(sd, strict=strict),
                    "'bagua.*'",
                    "saved with algorithm 'decentralized'",
                    repr(ddp2.bagua_algorithm.algorithm.name),
                )
            after = ddp2.inner.state_dict()
            assert after["state"].keys() == before["state"].keys() and after["state"].get("step") == before[
                "state"
            ].get("step")
            for a, b in zip(after["state"].get("step_state", []), before["state"].get("step_state", [])):
                assert torch.equal(a, b)
            ddp2.close()

    def malformed_entries_raise(self):
        torch = self.torch
        model, opt, ddp = self.wrapped("low_precision_decentralized", 15)
        self.train(ddp, opt, range(2))
        sd = ddp.state_dict()

        def without(key, **replace):
            out = {k: v for k, v in sd.items() if k != key}
            out.update(replace)
            return out

        for bad, needle in [
            (without("bagua.step"), "keys"),
            (without("bagua.algorithm"), "uint8"),
            (without("bagua.algorithm", **{"bagua.algorithm": torch.tensor([1.0, 2.0])}), "uint8"),
            (without("bagua.step", **{"bagua.step": torch.tensor(2.0)}), "int64"),
            (without("bagua.step", **{"bagua.step": torch.tensor(-1)}), "step"),
            (without("bagua.step_state.0", **{"bagua.step_state.1": sd["bagua.step_state.0"]}), "numbered"),
            (without("bagua.step_state.0", **{"bagua.step_state.0": sd["bagua.step_state.0"][:2]}), "shape"),
        ]:
            self.expect_error(RuntimeError, lambda: ddp.load_state_dict(bad), "'bagua.*'", needle)
        assert ddp.bagua_algorithm.step == 2
        ddp.close()

    def with_bagua_state_dict_stays_plain(self):
        torch = self.torch
        for name in ("low_precision_decentralized", "qadam"):
            model = self.mlp(16)
            plain = set(self.mlp(16).state_dict())
            opt, algo = self.algorithm(name, model)
            model.with_bagua([opt], algo)
            self.train(model, opt, range(3))
            sd = model.state_dict()
            assert set(sd) == plain and all(isinstance(v, torch.Tensor) for v in sd.values()), sorted(sd)
            state = model.bagua_ddp.state_dict()
            assert state["algorithm"] == name and state["state"]["step"] == 3, state
            assert [tuple(t.shape) for t in state["state"]["step_state"]] == [
                (op.num_state, b.numel) for b, op in zip(model.bagua_buckets, model.bagua_algorithm.ops)
            ]
            assert not model.load_state_dict({k: v.clone() for k, v in sd.items()}).missing_keys
            model.bagua_ddp.close()


for _name in ALGORITHMS:
    setattr(Worker, f"tensors_only_{_name}", lambda self, n=_name: self._tensors_only(n))
    setattr(Worker, f"resumes_bitwise_{_name}", lambda self, n=_name: self._resumes_bitwise(n))


# ---------------------------------------------------------------- pytest side


test_case, test_session_exits_cleanly = session_tests(
    __file__, {name: Session(world) for name, world in SESSIONS.items()}, case_names, timeout=240, test_timeout=300
)


if __name__ == "__main__":
    worker_main(Worker, case_names)

"""Framework-neutral descriptions of Bagua's algorithms, one module each.

A description is a frozen dataclass of hyperparameters, validated when built
(``TypeError`` for a wrong type, ``ValueError`` for a wrong value), registered
under its ``name`` with ``@register``. Its fields, their defaults, their docs
(the docstring's ``Args:`` section) and their checks are written only there:
the frontends' classes (``bagua_torch.algorithms``, ``bagua_jax.algorithms``,
``bagua.torch_api.algorithms``) take their signatures, argument docs and
validation from it (:mod:`bagua_core.algorithms.frontend`), and every list of
algorithms (``names()``, each frontend's ``__all__`` and
``Algorithm.registered()``) comes from the registry.

A description's :meth:`plan` says what a frontend must do with it: which
registered engine step runs (``csrc/ops/registry.h``) with which parameters,
which tensors travel (gradients or weights), in which phase of a training
step, how they are bucketed and which state the step needs. Each frontend has
one generic driver that runs any plan (``bagua_torch.distributed``,
``bagua_jax.transform``), so one description gives the same numbers in both.

What each algorithm communicates, and when:

* :class:`GradientAllReduce`: gradients, allreduced (mean or sum) bucket by
  bucket while backward runs.
* :class:`ByteGrad`: gradients, MinMaxUInt8-compressed scatter-reduce-gather
  (buckets padded to a multiple of the group size).
* :class:`HalfGrad`: gradients, as float16 or bfloat16, scatter-reduce-gather
  summed in float32 (buckets padded to a multiple of the group size).
* :class:`Decentralized`: weights, averaged with peers ("all": everyone;
  "shift_one": one rotating partner) concurrently with forward/backward, the
  average replacing the weights before the optimizer step; every
  ``communication_interval`` steps.
* :class:`LowPrecisionDecentralized`: weights, after the optimizer step, on a
  ring: MinMaxUInt8-compressed differences to the left and right neighbours,
  whose replicas each rank keeps (algorithm state); every
  ``communication_interval`` steps.
* :class:`QAdam`: gradients allreduced during a warm-up, then the Adam
  momentum, MinMaxUInt8-compressed (scatter-reduce-gather), with the second
  moment frozen.
* :class:`LocalSteps`: nothing for ``sync_interval`` steps, then the
  weights' movement since the last synchronisation, averaged (optionally
  MinMaxUInt8-compressed, with error feedback) and applied by an outer SGD
  with Nesterov momentum (local SGD / DiLoCo).
* :class:`LowRank`: gradients, after a warm-up of plain allreduce, as
  rank-r approximations P Q^T (PowerSGD, as torch's ``powerSGD_hook``), with
  error feedback; 1-D tensors uncompressed.
* :class:`AsyncModelAverage`: gradients allreduced during a warm-up, then
  weights, averaged over every rank by a background loop every
  ``sync_interval_ms`` while each rank trains at its own pace.

``hierarchical=True`` communicates within each node first (to a node leader),
then among node leaders, then back within the node. Constraints that depend
on the group (``shift_one`` needs an even number of peers, ByteGrad's chunk
count) are checked once, by the engine step, when a frontend binds the plan
to a group (:func:`bagua_core.algorithm_steps.check_plan`).

Adding an algorithm that needs no frontend code of its own (no optimizer of
its own, no background loop: a stateless class in each frontend) touches
nine files:

1. ``bagua_core/algorithms/<name>.py``: the ``@register``-ed description:
   fields with defaults, an ``Args:`` entry for each, checks in
   ``__post_init__`` (``check_bool``, ``check_int``, ``check_choice``),
   ``plan()``;
2. ``bagua_core/algorithms/__init__.py``: its import, and its line in the
   list above;
3. ``csrc/ops/<step>.h``: its engine step, the header stating its rule;
4. ``csrc/ops/<step>.cc``: the step (CMake finds the new file);
5. ``csrc/ops/registry.cc``: the step's entry in the registry of steps;
6. ``bagua_torch/algorithms/<name>.py``: ``class <Name>Algorithm(Algorithm)``
   with ``core_type = core.<Name>`` and a docstring of its torch specifics;
7. ``bagua_torch/algorithms/__init__.py``: its import;
8. ``bagua_jax/algorithms.py``: the same class for JAX;
9. ``tests/core/test_<name>.py``: its numbers against a reference in both
   frontends (a numpy reference of the scheme, ``tests/harness/reference/``,
   may be a file of its own).

A str field needs one line in the ``NON_DEFAULT`` table of
``tests/core/test_algorithm_surfaces.py`` (a tenth file). Element math the
kernels lack costs six more, because it is written once for CPU and CUDA and
dispatched by device: ``csrc/kernels/<math>.h`` (the ``BAGUA_HD`` element
functions) and ``<math>_cpu.cc`` (the host loops), the launchers in
``csrc/kernels/cuda_kernels.h`` / ``.cu``, the dispatch in
``csrc/ops/kernels.h`` / ``.cc``; and two for their tests: a binding in
``csrc/bindings/kernels.cc`` and ``tests/core/test_cuda_kernels.py`` (host
against numpy, CUDA against host on a GPU). One line in
``tests/core/test_device_path_ranks.py`` runs the step on the host
implementation of a device. :class:`HalfGrad` was added this way: ten
files, plus eight for its 16-bit wire kernels (``docs/design.md`` walks
through it).

Everything else follows the registry: ``names()``, every frontend's
``__all__``, ``Algorithm.registered()`` and ``init(name)``,
``bagua.torch_api.algorithms``, ``bagua_jax``'s top level, ``bagua-compare``
(``tests/core/test_compare.py`` then compares torch and JAX on it), and
``tests/core/test_algorithm_surfaces.py``, which proves that the three surfaces
agree with the description; it makes up a non-default value for each bool,
int and float field. A frontend without a class for a registered
description fails to import, naming it. The documentation follows too (not
counted): the algorithm table (README.md, docs) is made from the plans
(``python docs/_ext/bagua_docs.py --write-readme`` rewrites the README's
copy), and ``make docs`` fails until ``docs/algorithms.md`` has a section for
the new description.
"""

from typing import Union

from bagua_core.algorithms._base import (
    AFTER_OPTIMIZER_STEP,
    BACKGROUND,
    BACKWARD,
    FORWARD_START,
    GRADIENTS,
    WEIGHTS,
    Plan,
    as_description,
    by_name,
    check_tensors,
    description_type,
    names,
)
from bagua_core.algorithms.async_model_average import AsyncModelAverage
from bagua_core.algorithms.bytegrad import ByteGrad
from bagua_core.algorithms.decentralized import PEER_SELECTION_MODES, Decentralized
from bagua_core.algorithms.gradient_allreduce import GradientAllReduce
from bagua_core.algorithms.halfgrad import HalfGrad
from bagua_core.algorithms.local_steps import LocalSteps
from bagua_core.algorithms.low_precision_decentralized import LowPrecisionDecentralized
from bagua_core.algorithms.low_rank import LowRank
from bagua_core.algorithms.qadam import QAdam

_DESCRIPTIONS = tuple(description_type(name) for name in names())
AlgorithmDescription = Union[_DESCRIPTIONS]  # any registered description

__all__ = [
    "AFTER_OPTIMIZER_STEP",
    "BACKGROUND",
    "BACKWARD",
    "FORWARD_START",
    "GRADIENTS",
    "PEER_SELECTION_MODES",
    "WEIGHTS",
    "AlgorithmDescription",
    *(d.__name__ for d in _DESCRIPTIONS),
    "Plan",
    "as_description",
    "by_name",
    "check_tensors",
    "description_type",
    "names",
]

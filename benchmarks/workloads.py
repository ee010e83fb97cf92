"""Named workloads for ``python -m benchmarks.compare``: a small registry, easy to extend.

A :class:`NamedWorkload` fixes what a comparison runs (task, model size, clients, rounds);
:meth:`NamedWorkload.workload` turns it into the harness's :class:`~benchmarks.core.Workload`.
Adding one is a :func:`register` call at the bottom of this module (or in the module that
needs it); a new *task* also needs a client behaviour in both frameworks' apps (see
:data:`benchmarks.core.TASKS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.core import TASKS, Workload

__all__ = [
    "DIGITS_MLP_PARAMS",
    "FASHION_CNN_PARAMS",
    "WORKLOADS",
    "NamedWorkload",
    "get_workload",
    "register",
]

#: Parameters of :mod:`benchmarks.apps.digits_mlp`'s MLP (a test keeps this in step).
DIGITS_MLP_PARAMS = 26_122
#: Parameters of :mod:`benchmarks.apps.fashion_cnn`'s CNN (a test keeps this in step).
FASHION_CNN_PARAMS = 114_314


@dataclass(frozen=True)
class NamedWorkload:
    """A workload the comparison can run by name.

    Attributes
    ----------
    name
        The ``--workload`` value; also names the results file.
    task
        One of :data:`benchmarks.core.TASKS`.
    params
        Float32 parameters of the model.
    clients
        Client sites (deployment) or virtual clients (simulation); all train every round.
    rounds
        Default rounds (``--rounds`` overrides); round 1 is start-up, 2.. are steady.
    timeout_s
        Wall-clock limit of one run (one system, one mode, one repeat).
    description
        One line for ``--list`` and the results file.
    """

    name: str
    task: str
    params: int
    clients: int
    rounds: int = 5
    timeout_s: float = 900.0
    description: str = ""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"workload {self.name!r}: unknown task {self.task!r}, not in {TASKS}")
        if self.params < 1 or self.clients < 1:
            raise ValueError(f"workload {self.name!r}: params and clients must be positive")
        if self.rounds < 2:
            raise ValueError(f"workload {self.name!r}: needs >= 2 rounds (round 1 is start-up)")

    def workload(self, rounds: int | None = None, timeout_s: float | None = None) -> Workload:
        """The harness's workload, optionally with other rounds or timeout."""
        chosen = self.rounds if rounds is None else rounds
        if chosen < 2:
            raise ValueError(f"rounds must be >= 2 (round 1 is start-up), got {chosen}")
        limit = self.timeout_s if timeout_s is None else timeout_s
        return Workload(self.params, self.clients, chosen, limit, self.task)


#: Every registered workload by name.
WORKLOADS: dict[str, NamedWorkload] = {}


def register(workload: NamedWorkload) -> NamedWorkload:
    """Add ``workload`` to :data:`WORKLOADS`; a second one with the same name is an error."""
    if workload.name in WORKLOADS:
        raise ValueError(f"workload {workload.name!r} is already registered")
    WORKLOADS[workload.name] = workload
    return workload


def get_workload(name: str) -> NamedWorkload:
    """The registered workload ``name``; the error lists the known names."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(
            f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}"
        ) from None


register(
    NamedWorkload(
        "echo-1m",
        "echo",
        1_000_000,
        10,
        description="10 clients return a 1M-parameter model plus a client constant; no training",
    )
)
register(
    NamedWorkload(
        "echo-10m",
        "echo",
        10_000_000,
        10,
        timeout_s=1500.0,
        description="as echo-1m with a 10M-parameter (40 MB) model",
    )
)
register(
    NamedWorkload(
        "mlp-digits",
        "mlp-digits",
        DIGITS_MLP_PARAMS,
        10,
        timeout_s=1800.0,
        description="10 clients train a 64-128-128-10 MLP on sklearn digits (5 local epochs), "
        "FedAvg; test accuracy of the final model",
    )
)
register(
    NamedWorkload(
        "cnn-fashion",
        "cnn-fashion",
        FASHION_CNN_PARAMS,
        10,
        timeout_s=1800.0,
        description="10 clients train a small CNN (2 conv layers) on 600 Fashion-MNIST images "
        "each (1 local epoch), FedAvg; test accuracy on the 10,000 test images",
    )
)

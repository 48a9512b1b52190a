"""A step's checks of device values (finite? positive? a Cholesky factorisation that succeeded?) answered
now, one host read each, or kept on the device and answered together later.

Every such read stalls a GPU until its queue drains. While `deferring`, a check keeps its device value
with the host rule that judges it, and answers "holds"; `settle()` then reads every kept value in one
crossing, judges each by its rule, and names the first step whose check failed. A caller that
defers must be able to go back: the run's speculation (pitcheck.trajectory.speculation) keeps the last
settled state and retakes, with every check answered at once, the steps from there through the first
failure, so the run's numbers and events are those of a run that never deferred.
"""
from __future__ import annotations

from typing import Callable


def _every_entry_true(values: list[float]) -> bool:
    return all(values)


class DeferredChecks:
    """The checks kept since the last settle: (step, device tensor, rule over its values as floats)."""

    def __init__(self):
        self.deferring = False
        self.step = 0  # the step the checks kept now belong to (set by whoever defers)
        self.kept: list[tuple[int, object, Callable[[list[float]], bool]]] = []

    def keep(self, value, rule: Callable[[list[float]], bool] = _every_entry_true) -> bool:
        """Keep a device tensor (a 0-d bool, or a vector) with the host rule its values must pass; holds."""
        self.kept.append((self.step, value, rule))
        return True

    def settle(self) -> int | None:
        """Judge every kept check; the first step whose check failed, or None. Clears what was kept."""
        if not self.kept:
            return None
        import torch  # kept values are tensors: torch is loaded

        kept, self.kept = self.kept, []
        flat = [value.reshape(-1).to(torch.float64) for _, value, _ in kept]
        host = torch.cat(flat).tolist()  # the one read: every kept value, as float64
        values, at = [], 0
        for part in flat:
            values.append(host[at:at + part.numel()])
            at += part.numel()
        failed = [step for (step, _, rule), v in zip(kept, values) if not rule(v)]
        return min(failed) if failed else None

    def discard(self) -> None:
        """Forget what was kept (the state it judged was put back)."""
        self.kept = []

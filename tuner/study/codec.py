"""The codec between a space's params and the sampler's distributions (`Codec`), and the sampler's constraint key.

A param whose values are all numbers (tile sizes, vector widths, thread counts) is *ordered*: the sampler sees an
``IntDistribution`` over the index of the value in ascending order, so TPE, GP and CMA-ES can use the order (a
categorical distribution hides it: CMA-ES then falls back to random on every param). Strings and booleans stay
categorical. The durable study keeps the real values under a ``CategoricalDistribution`` of the space's declared
values, exactly as studies were recorded before, so the dashboard, exports and replay of older recordings see real
values; `Codec.record` converts a sampler-side trial into that form and `Codec.sampler_trial` converts a stored
trial back. `CONSTRAINT_KEY` names the constraint the driver sets on every trial (0.0 feasible, 1.0 infeasible).
"""

from __future__ import annotations

import copy
from typing import Any

from tuner.study.failures import FAILURE_ATTR

CONSTRAINT_KEY = "space"


def is_ordered(values: tuple[Any, ...]) -> bool:
    """True when every value is a real number (booleans are not): such a param gets an ordered distribution."""
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


class Codec:
    """Maps a space's params between real values (storage, templates) and the sampler's distributions."""

    def __init__(self, params: dict[str, tuple[Any, ...]], ordered: bool = True):
        from optuna.distributions import CategoricalDistribution, IntDistribution

        self.params = params
        #: name → values in the sampler's index order (ascending for ordered params)
        self.order: dict[str, list[Any]] = {}
        self.sampler_dists: dict[str, Any] = {}
        self.record_dists = {name: CategoricalDistribution(list(values)) for name, values in params.items()}
        for name, values in params.items():
            if ordered and is_ordered(values):
                self.order[name] = sorted(values)
                self.sampler_dists[name] = IntDistribution(0, len(values) - 1)
            else:
                self.sampler_dists[name] = CategoricalDistribution(list(values))
        self._index = {name: {v: i for i, v in enumerate(vs)} for name, vs in self.order.items()}

    # -- params -------------------------------------------------------------------------------------------------
    def decode(self, sampled: dict[str, Any]) -> dict[str, Any]:
        """Sampler-side params → real values."""
        return {n: self.order[n][v] if n in self.order else v for n, v in sampled.items()}

    def encode(self, params: dict[str, Any]) -> dict[str, Any]:
        """Real values → sampler-side params (for `enqueue_trial`). A value outside the space raises KeyError."""
        return {n: self._index[n][v] if n in self._index else v for n, v in params.items()}

    # -- trials -------------------------------------------------------------------------------------------------
    def record(self, frozen):
        """A sampler-side FrozenTrial as the durable study records it: real values, categorical distributions,
        and a failure's true state (PRUNED for a constraint violation, FAIL otherwise) with no values."""
        from optuna.trial import TrialState

        out = copy.copy(frozen)
        out.params = self.decode(frozen.params)
        out.distributions = {n: self.record_dists[n] for n in frozen.params}
        kind = frozen.user_attrs.get(FAILURE_ATTR)
        if kind is not None and frozen.state == TrialState.COMPLETE:
            out.state = TrialState.PRUNED if kind == "invalid" else TrialState.FAIL
            out.values = None
        return out

    def sampler_trial(self, frozen, worst: list[float] | None):
        """A stored FrozenTrial as the sampler should see it (params as indices); a recorded failure becomes
        COMPLETE with `worst` (when known) so the sampler learns from it, as in a live study."""
        import optuna
        from optuna.trial import TrialState

        if any(n not in self.params or v not in self.params[n] for n, v in frozen.params.items()):
            return None  # a value the space no longer has: the sampler cannot represent it
        state, values = frozen.state, frozen.values
        failed = FAILURE_ATTR in frozen.user_attrs and state in (TrialState.FAIL, TrialState.PRUNED)
        if failed and frozen.user_attrs[FAILURE_ATTR] != "interrupted" and worst is not None:
            state, values = TrialState.COMPLETE, list(worst)
        if state == TrialState.RUNNING or state == TrialState.WAITING:
            return None
        return optuna.trial.create_trial(
            state=state,
            values=values if state == TrialState.COMPLETE else None,
            params=self.encode(frozen.params),
            distributions=dict(self.sampler_dists)
            if not frozen.params
            else {n: self.sampler_dists[n] for n in frozen.params},
            user_attrs=dict(frozen.user_attrs),
            system_attrs=dict(frozen.system_attrs),
        )

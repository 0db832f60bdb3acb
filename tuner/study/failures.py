"""The failure policy: how a failed config is told to the sampler, and which recorded trials failed.

Optuna's samplers skip FAIL trials (GP skips PRUNED ones too), so a sampler told only "failed" proposes the same
config again and again. A failure is told COMPLETE with the worst value of each objective measured so far and
constraint 1.0 (infeasible), which every sampler learns from (`worst_values`); the durable record keeps its true
state (PRUNED for a constraint violation, FAIL for a kernel failure) and its `failure` attr (`FAILURE_ATTR`). TPE
proposing inside the valid set is told only constraint violations so (`tells_failures_as_worst`).
`evaluation_failed` tells a recorded trial whose evaluation failed from an interrupted one.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuner.core.result import INTERRUPTED, TrialAttr

#: user attr that marks a trial whose sampler-side state differs from its recorded one
FAILURE_ATTR = "failure"


def tells_failures_as_worst(sampler: str, inside_valid_set: bool, kind: str) -> bool:
    """Whether a failure of kind `kind` is told to the sampler `sampler` as COMPLETE with the worst values so far
    (infeasible, see `worst_values`), or left out of what it models (told FAIL: Optuna's samplers skip it).

    TPE inside the valid set leaves a failed evaluation (compile, launch, wrong result, timeout) out. It needs no
    failure to keep away from a config: `ValidSetSampler` never proposes an explored one again. And TPE counts
    every infeasible trial among its bad configs, so a region that holds the optimum next to many failures (a
    resource limit: shared-memory staging whose large tiles fail to compile) looks bad and is left for good; on
    such a space (benchmarks/data/kt/stencil_like, 22% of its configs failing) TPE fell below uniform random
    sampling of the valid set at every budget. A constraint violation (``invalid``) is still told: it says where
    the valid set ends, which no later proposal should cross."""
    return kind == "invalid" or not (sampler == "tpe" and inside_valid_set)


def worst_values(values: list[list[float]], directions: Sequence[str]) -> list[float] | None:
    """Per objective, the worst value among `values` (the measured trials so far); None when there are none."""
    if not values:
        return None
    out = []
    for i, direction in enumerate(directions):
        column = [v[i] for v in values]
        out.append(min(column) if direction == "maximize" else max(column))
    return out


def evaluation_failed(trial) -> bool:
    """A recorded trial whose evaluation failed (compile, launch, wrong result, timeout, or an invalid answer of
    the evaluator), as opposed to an interrupted one."""
    kind = trial.user_attrs.get(TrialAttr.FAILURE)
    return trial.state.name in ("FAIL", "PRUNED") and kind is not None and kind != INTERRUPTED

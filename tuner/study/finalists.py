"""The finalists: the fastest configs of a study, re-timed with a longer budget on fresh inputs (verified again).

A screening figure (`tuner.gpu.timing`, ~5 ms of timed work) steers the search; the figure a user reads, exports
or compares is the finalists', recorded in the study's user attr "finalists" and in the driver's summary.
"""

from __future__ import annotations

from typing import Any

from tuner.core.result import StudyAttr, TrialAttr


def retime_finalists(driver, fast, pool, set_study_attr) -> list[dict[str, Any]]:
    """Re-time the best configs for the study's first objective (the fastest) with a longer budget on fresh
    inputs (verified again), so the figure a user reads or exports is not a screening figure. Recorded in the
    study's user attr "finalists"."""
    from optuna.trial import TrialState

    from tuner.space.objective import goal_of

    unit_key = "tflops" if driver.family.throughput_unit == "TFLOP/s" else "tbps"
    target = goal_of(driver.objectives, driver.family.throughput_unit)  # "fastest" is best for the first objective
    measured = [
        t
        for t in fast.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if TrialAttr.DUPLICATE_OF not in t.user_attrs and TrialAttr.FAILURE not in t.user_attrs
    ]
    top = sorted(measured, key=lambda t: (target.rank(target.value(t.user_attrs)), t.number))[: driver.opts.finalists]
    if not top:
        return []
    for i, t in enumerate(top):
        median_ms = t.user_attrs.get("median_ms")
        budget_ms = driver.opts.final_budget_ms
        if median_ms:
            budget_ms = min(budget_ms, driver.opts.final_reps * float(median_ms))
        pool.submit(-1 - i, driver.codec.decode(t.params), budget_ms=budget_ms, screening=False)
    results: dict[int, Any] = {}
    while len(results) < len(top):
        for number, result in pool.poll():
            results[number] = result
    finalists = []
    for i, t in enumerate(top):
        r = results[-1 - i]
        entry = {
            "trial": t.number,
            "params": driver.codec.decode(t.params),
            "uri": t.user_attrs.get("uri"),
            "screening_" + unit_key: t.user_attrs[unit_key],
        }
        if r.ok:
            entry.update(
                {
                    k: r.to_dict()[k]
                    for k in (
                        "median_ms",
                        "p20_ms",
                        "p80_ms",
                        "repetitions",
                        "tbps",
                        "tflops",
                        "fraction_of_ceiling",
                        "registers",
                        "smem_bytes",
                        "gpu",
                    )
                }
            )
        else:
            entry.update({"failure": r.kind, "reason": r.reason})
        finalists.append(entry)
    finalists.sort(key=lambda e: target.rank(target.value(e)) if "failure" not in e else float("inf"))
    set_study_attr(StudyAttr.FINALISTS, finalists)
    return finalists

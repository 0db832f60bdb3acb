"""Made-up results for the tests of what surrounds an evaluator (the pools' scheduling core, the isolated worker,
deadlines): a `Measurement` with plain, consistent figures, no GPU behind it; and synthetic recordings, studies
of made-up trials that replays answer from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner.core.result import Measurement


def measurement(p80_ms: float = 1.1, uri: str = "") -> Measurement:
    """A Measurement whose 80th percentile is `p80_ms` (median 0.9 and 20th percentile 0.8 of it), at a quarter of
    a 4 TB/s ceiling."""
    return Measurement(
        median_ms=p80_ms * 0.9,
        p20_ms=p80_ms * 0.8,
        p80_ms=p80_ms,
        repetitions=10,
        bytes_moved=1,
        flops=0,
        tbps=1.0,
        tflops=0.0,
        ceiling_tbps=4.0,
        fraction_of_ceiling=0.25,
        registers=1,
        smem_static_bytes=0,
        smem_dynamic_bytes=0,
        spill_bytes=0,
        uri=uri,
    )


def recorded_study(url: str, trials: Sequence[Any], study_name: str = "recorded", directions=("maximize",)) -> None:
    """A new study `study_name` at `url` holding `trials` (FrozenTrials, as `optuna.trial.create_trial` makes them),
    written in one transaction by the writer process's `TrialWriter` (`Study.add_trial` costs ~80 statements and
    a commit a trial)."""
    import optuna

    from tuner.store.trialwriter import TrialWriter

    storage = optuna.storages.RDBStorage(url)
    optuna.create_study(study_name=study_name, storage=storage, directions=list(directions))
    TrialWriter(storage).write(storage.get_study_id_from_name(study_name), trials)

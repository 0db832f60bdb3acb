"""An evaluator that answers from a recorded study instead of a GPU.

Record a study once on a GPU (``tuner study transpose --sampler grid ...``), then replay it anywhere: CPU tests run
the real driver over real Ray against it, and users compare samplers without spending GPU time. It implements
the same protocol as the GPU evaluator: ``evaluate(params) -> Result``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tuner.errors import InputError
from tuner.result import FAILURE_KINDS, Invalid, Measurement, Result

_MEASUREMENT_FIELDS = set(Measurement.__dataclass_fields__)


def params_key(params: dict[str, Any]) -> str:
    """A canonical key for a config: the same params give the same key however they were typed or ordered."""
    return json.dumps({k: params[k] for k in sorted(params)}, sort_keys=True)


def result_from_attrs(state: str, attrs: dict[str, Any]) -> Result:
    """Rebuild the Result a trial recorded (its user attrs hold every figure the evaluator reported)."""
    if state == "COMPLETE":
        return Measurement(**{k: v for k, v in attrs.items() if k in _MEASUREMENT_FIELDS})
    kind = attrs.get("failure", "invalid")
    cls = FAILURE_KINDS.get(kind, Invalid)
    return cls(reason=attrs.get("reason", kind))


class ReplayEvaluator:
    """Answers configs from the trials of a recorded study database (SQLite file or SQLAlchemy URL).

    Only verified measurements and kernel failures are replayed; duplicates and interrupted trials are skipped.
    A config the recording lacks is `Invalid` with a reason saying so. `delay_s` makes each answer take that long,
    to stand in for GPU time when testing the driver's scaling.
    """

    def __init__(self, path: str | Path, study_name: str | None = None, delay_s: float = 0.0):
        self.path = str(path)
        self.delay_s = delay_s
        self.records = load_records(self.path, study_name)

    def __len__(self) -> int:
        return len(self.records)

    def covers(self, configs) -> int:
        return sum(1 for c in configs if params_key(c) in self.records)

    def evaluate(self, params: dict[str, Any]) -> Result:
        if self.delay_s:
            time.sleep(self.delay_s)
        hit = self.records.get(params_key(params))
        if hit is None:
            return Invalid(reason=f"config not in the replay recording {self.path}")
        return result_from_attrs(*hit)


def load_records(path: str, study_name: str | None = None) -> dict[str, tuple[str, dict[str, Any]]]:
    """params key → (state, user attrs) for every replayable trial of the recorded study."""
    import optuna

    from tuner.dbfiles import readonly_url

    url = readonly_url(path)  # a recording is an input: never written, not even Optuna's tables
    try:
        storage = optuna.storages.RDBStorage(url, skip_compatibility_check=False)
        summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    except Exception as exc:  # SQLAlchemy/Optuna raise many types for a file that is not a study database
        raise InputError(f"cannot read as a study database: {type(exc).__name__}", path) from None
    if not summaries:
        raise InputError("holds no study", path)
    names = [s.study_name for s in summaries]
    if study_name is None:
        study_name = names[0]
    elif study_name not in names:
        raise InputError(f"holds no study {study_name!r} (has: {', '.join(names)})", path)
    study = optuna.load_study(study_name=study_name, storage=storage)
    records: dict[str, tuple[str, dict[str, Any]]] = {}
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        if "duplicate_of" in attrs or attrs.get("failure") == "interrupted":
            continue
        if trial.state.name == "COMPLETE" or (trial.state.name == "FAIL" and "failure" in attrs):
            records[params_key(trial.params)] = (trial.state.name, dict(attrs))
    return records

"""An evaluator that answers from a recorded study instead of a GPU.

Record a study once on a GPU (``tuner study transpose --sampler grid ...``), then replay it anywhere: CPU tests run
the real driver over real Ray against it, and users compare samplers without spending GPU time. It implements
the `tuner.evaluator.Evaluator` protocol; its `measures` is False (it needs no cubin and re-timing changes
nothing), and its info names the recording as the GPU and the recorded study's arch and GPU facts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tuner.errors import InputError
from tuner.gpu import DEFAULT_ARCH, GpuFacts
from tuner.kernels.base import Family
from tuner.result import FAILURE_KINDS, INTERRUPTED, Invalid, Measurement, Result, StudyAttr, TrialAttr
from tuner.space import params_key

_MEASUREMENT_FIELDS = set(Measurement.__dataclass_fields__)


def result_from_attrs(state: str, attrs: dict[str, Any]) -> Result:
    """Rebuild the Result a trial recorded (its user attrs hold every figure the evaluator reported)."""
    if state == "COMPLETE":
        return Measurement(**{k: v for k, v in attrs.items() if k in _MEASUREMENT_FIELDS})
    kind = attrs.get(TrialAttr.FAILURE, Invalid.kind)
    cls = FAILURE_KINDS.get(kind, Invalid)
    return cls(reason=attrs.get(TrialAttr.REASON, kind))


class ReplayEvaluator:
    """Answers configs from the trials of a recorded study database (SQLite file or SQLAlchemy URL).

    Only verified measurements and kernel failures are replayed; duplicates and interrupted trials are skipped.
    A config the recording lacks is `Invalid` with a reason saying so. `delay_s` makes each answer take that long,
    to stand in for GPU time when testing the driver's scaling.
    """

    measures = False

    def __init__(self, path: str | Path, study_name: str | None = None, delay_s: float = 0.0,
                 gpu_index: int = 0):
        self.path = str(path)
        self.delay_s = delay_s
        self.gpu_index = gpu_index
        self.records, self.study_attrs, self.param_names = load_recording(self.path, study_name)

    def __len__(self) -> int:
        return len(self.records)

    def covers(self, configs) -> int:
        return sum(1 for c in configs if params_key(c) in self.records)

    def start(self) -> dict[str, Any]:
        facts = GpuFacts.from_dict(self.study_attrs.get(StudyAttr.GPU_FACTS))
        return {"gpu": f"replay:{Path(self.path).name}", "gpu_index": self.gpu_index,
                "arch": str(self.study_attrs.get(StudyAttr.ARCH) or DEFAULT_ARCH), "ceiling_tbps": None,
                "gpu_facts": facts.to_dict()}

    def evaluate(self, compiled: Any, family: Family | str, config: dict[str, Any], problem: Any,
                 seed: int | None = None, budget_ms: float = 25.0, min_reps: int = 10) -> Result:
        """The recorded result of the config whose params `config` holds (its derived values are ignored)."""
        if self.delay_s:
            time.sleep(self.delay_s)
        hit = self.records.get(params_key({name: config[name] for name in self.param_names if name in config}))
        if hit is None:
            return Invalid(reason=f"config not in the replay recording {self.path}")
        return result_from_attrs(*hit)

    def close(self) -> None:
        pass


def load_recording(path: str, study_name: str | None = None
                   ) -> tuple[dict[str, tuple[str, dict[str, Any]]], dict[str, Any], list[str]]:
    """(params key → (state, user attrs) for every replayable trial, the study's user attrs, its param names)."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    from tuner.dbfiles import readonly_url

    url = readonly_url(path)  # a recording is an input: never written, not even Optuna's tables
    try:
        storage = optuna.storages.RDBStorage(url, skip_compatibility_check=False)
        summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    except (SQLAlchemyError, RuntimeError) as exc:  # not a database, or not Optuna's schema (version check)
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
    param_names: set[str] = set()
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        param_names.update(trial.params)
        if TrialAttr.DUPLICATE_OF in attrs or attrs.get(TrialAttr.FAILURE) == INTERRUPTED:
            continue
        if trial.state.name == "COMPLETE" or (trial.state.name == "FAIL" and TrialAttr.FAILURE in attrs):
            records[params_key(trial.params)] = (trial.state.name, dict(attrs))
    return records, dict(study.user_attrs), sorted(param_names)


"""An evaluator that answers from a recorded study instead of a GPU.

Record a study once on a GPU (``tuner study transpose --sampler grid ...``), then replay it anywhere: CPU tests run
the real driver over real Ray against it, and users compare samplers without spending GPU time. It implements
the `tuner.gpu.protocol.Evaluator` protocol; its `measures` is False (it needs no cubin and re-timing changes
nothing), and its info names the recording as the GPU and the recorded study's arch and GPU facts. Each replayed
measurement's `gpu` names the GPU that measured it and the recording (`replayed_gpu`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError
from tuner.core.gpufacts import DEFAULT_ARCH, GpuFacts
from tuner.core.result import FAILURE_KINDS, INTERRUPTED, Invalid, Measurement, Result, StudyAttr, TrialAttr
from tuner.gpu.protocol import EvaluateRequest, Evaluator, Spent
from tuner.space.problem import Problem
from tuner.space.space import SearchSpace, params_key
from tuner.study.pool import Pool

_MEASUREMENT_FIELDS = set(Measurement.__dataclass_fields__)


def result_from_attrs(state: str, attrs: dict[str, Any]) -> Result:
    """Rebuild the Result a trial recorded (its user attrs hold every figure the evaluator reported)."""
    if state == "COMPLETE":
        return Measurement(**{k: v for k, v in attrs.items() if k in _MEASUREMENT_FIELDS})
    kind = attrs.get(TrialAttr.FAILURE, Invalid.kind)
    cls = FAILURE_KINDS.get(kind, Invalid)
    return cls(reason=attrs.get(TrialAttr.REASON, kind))


def gpu_label(path: str | Path) -> str:
    """What a replay of the recording at `path` reports as its GPU (and a study's default name carries)."""
    return f"replay:{Path(path).name}"


class ReplayEvaluator(Evaluator):
    """Answers configs from the trials of a recorded study database (SQLite file or SQLAlchemy URL).

    Only verified measurements and kernel failures are replayed; duplicates and interrupted trials are skipped.
    A config the recording lacks is `Invalid` with a reason saying so. `delay_s` makes each answer take that long,
    to stand in for GPU time when testing the driver's scaling. `later`: knobs the space has and the recording
    lacks (`later_knobs`), with the value the recording stands for; a config with another value is not recorded.
    """

    measures = False

    def __init__(
        self,
        path: str | Path,
        study_name: str | None = None,
        delay_s: float = 0.0,
        gpu_index: int = 0,
        later: dict[str, Any] | None = None,
    ):
        self.path = str(path)
        self.later = dict(later or {})
        self.delay_s = delay_s
        self.gpu_index = gpu_index
        self.records, self.study_attrs, self.param_names = load_recording(self.path, study_name)

    def __len__(self) -> int:
        return len(self.records)

    def covers(self, configs) -> int:
        return sum(1 for c in configs if params_key(c) in self.records)

    def start(self) -> dict[str, Any]:
        facts = GpuFacts.from_dict(self.study_attrs.get(StudyAttr.GPU_FACTS))
        return {
            "gpu": gpu_label(self.path),
            "gpu_index": self.gpu_index,
            "arch": str(self.study_attrs.get(StudyAttr.ARCH) or DEFAULT_ARCH),
            "ceiling_tbps": None,
            "gpu_facts": facts.to_dict(),
        }

    def evaluate(self, request: EvaluateRequest) -> Result:
        """The recorded result of the config whose params the request's `config` holds (its derived values are
        ignored)."""
        config = request.config
        if self.delay_s:
            time.sleep(self.delay_s)
        hit = self.records.get(params_key({name: config[name] for name in self.param_names if name in config}))
        if hit is None or any(config.get(name, value) != value for name, value in self.later.items()):
            return Invalid(reason=f"config not in the replay recording {self.path}")
        result = result_from_attrs(*hit)
        if isinstance(result, Measurement):
            # A replayed row must not pass for a measurement of this run: its GPU names the recording too.
            result = dataclasses.replace(result, gpu=replayed_gpu(result.gpu, self.path))
        return result

    def close(self) -> None:
        pass


#: what a replayed measurement's GPU ends with: ``NVIDIA H200 (replay of transpose_h200.db)``
REPLAY_MARK = " (replay of "


def replayed_gpu(gpu: str, recording: str) -> str:
    """The GPU a replayed measurement names: the one that measured it, and the recording it was replayed from
    (its file name). A row the recording had itself replayed keeps the name of the recording that measured it."""
    if REPLAY_MARK in gpu:
        return gpu
    return f"{gpu or 'unknown GPU'}{REPLAY_MARK}{Path(recording).name})"


@dataclasses.dataclass
class RecordedSubspace(SearchSpace):
    """A space cut down to the configs a recording holds (see `recorded_subspace`): any other config is invalid,
    with a reason saying so, and enumeration yields only recorded configs."""

    recorded: frozenset[str] = frozenset()

    def validate(self, config: dict[str, Any], problem: Problem | None = None) -> str | None:
        reason = super().validate(config, problem)
        if reason is None and params_key(config) not in self.recorded:
            return "config not in the replay recording (the searched space is the recorded subset)"
        return reason

    def enumerate(
        self, problem: Problem | None = None, budget: int | None = None, errors: list[str] | None = None
    ) -> Iterator[dict[str, Any]]:
        for config in super().enumerate(problem, budget, errors):
            if params_key(config) in self.recorded:
                yield config


def later_knobs(space: SearchSpace, recorded_names) -> dict[str, Any]:
    """The space's knobs that a recording's configs lack (it was made before they existed), each at the space's
    default: a knob joins a space with the default that leaves the kernel as it was (transpose's `order: row`),
    so that is the value the recording measured."""
    return {name: space.default[name] for name in space.params if name not in set(recorded_names)}


def recorded_configs(space: SearchSpace, records) -> Iterator[dict[str, Any]]:
    """Each config of a recording (params key → record) as `space` names it: a knob the recording predates at the
    space's default (`later_knobs`)."""
    for key in records:
        config = json.loads(key)
        yield {**later_knobs(space, config), **config}


def recorded_subspace(space: SearchSpace, records: dict[str, Any], problem: Problem | None = None) -> SearchSpace:
    """The part of `space` that a recording (params key → record, as `load_records` returns) holds: the valid
    configs it recorded (measured or failed), each param's values cut to those they use (in declared order), and
    as default the space's default when recorded, else the recorded config nearest to it (fewest steps along
    each param's values; the first in enumeration order among equals). A search replayed over a partial
    recording is a search over this subset: a config the recording lacks is neither proposed as valid nor
    counted. A recording made before a knob existed holds that knob at the space's default (`later_knobs`).
    InputError when the recording holds none of the space's valid configs. A space that lists its valid
    configs is its list cut to the recorded ones (`tuner.space.configs.listed_subset`)."""
    from tuner.space.configs import ListedSpace, listed_subset

    if isinstance(space, ListedSpace):
        return listed_subset(space, frozenset(records), problem)
    configs = [
        c
        for c in recorded_configs(space, records)
        if set(c) == set(space.params) and space.validate(c, problem) is None
    ]
    if not configs:
        raise InputError("replay file holds none of the space's configs", str(space.path))
    keys = frozenset(params_key(c) for c in configs)
    params = {n: tuple(v for v in values if any(c[n] == v for c in configs)) for n, values in space.params.items()}
    index = {n: {v: i for i, v in enumerate(values)} for n, values in space.params.items()}
    default = dict(space.default)
    if params_key(default) not in keys:
        order = _listing_order(space, problem or space.problems[0], keys)
        default = min(
            configs,
            key=lambda c: (sum(abs(index[n][c[n]] - index[n][default[n]]) for n in index), order.get(params_key(c), 0)),
        )
    fields = {f.name: getattr(space, f.name) for f in dataclasses.fields(space)}
    return RecordedSubspace(
        **{
            **fields,
            "params": params,
            "default": dict(default),
            "description": f"{space.description} [replayed: the {len(keys)} recorded configs]",
        },
        recorded=keys,
    )


def _listing_order(space: SearchSpace, problem: Problem, keys: frozenset[str]) -> dict[str, int]:
    """Each config of `keys` (params keys of valid configs) → its place in the space's valid listing
    (`SearchSpace.enumerate`'s order): the row of the valid index where the space lists within the walk's budget
    (gemm.yaml's 268k configs in ~0.1 s, or from the cache dir), else a walk of the whole space."""
    from tuner.study.validset import valid_index

    index = valid_index(space, problem)
    if index.complete:
        rows = {key: index.row_of(key) for key in keys}
        return {key: row for key, row in rows.items() if row is not None}
    return {params_key(c): i for i, c in enumerate(space.enumerate(problem)) if params_key(c) in keys}


#: recordings read in this process, by (path, study name, size, mtime): a replayed study reads its recording
#: twice (checks, then the pool) and a benchmark replays one recording hundreds of times. Process-wide: a cache
#: keyed by the file's identity, whose entry is the same for every study that reads it
_LOADED: dict[tuple[Any, ...], tuple[dict[str, tuple[str, dict[str, Any]]], dict[str, Any], list[str]]] = {}


def load_recording(
    path: str, study_name: str | None = None
) -> tuple[dict[str, tuple[str, dict[str, Any]]], dict[str, Any], list[str]]:
    """(params key → (state, user attrs) for every replayable trial, the study's user attrs, its param names) of a
    recording: a study database (a SQLite file, ``.db.gz`` for a gzipped one, or a SQLAlchemy URL) or a Kernel
    Tuner cache (``.json``, ``.json.gz``; see `tuner.store.kt`). A file read before in this process and unchanged
    since is answered from memory, the same objects each time: callers must not modify them."""
    try:
        stat = Path(path).stat() if "://" not in path else None
    except OSError:
        stat = None
    if stat is None:
        return _load_recording(path, study_name)
    key = (str(Path(path).resolve()), study_name, stat.st_size, stat.st_mtime_ns)
    if key not in _LOADED:
        _LOADED[key] = _load_recording_cached(path, study_name)
    return _LOADED[key]


#: bump when what `_load_recording` keeps of a recording changes
RECORDING_CACHE_VERSION = "1"


def _load_recording_cached(path: str, study_name: str | None):
    """`_load_recording` of a study database file through a cache under the tuner cache dir, keyed by the file's
    bytes (with its SQLite write-ahead log, which readers see too) and the study's name: reading a recording
    through Optuna costs most of a second (its storage's schema checks, every trial's attributes), the cached
    JSON a few milliseconds. Kernel Tuner caches are JSON already and are read directly."""
    import hashlib

    from tuner.build.compile import cache_dir
    from tuner.build.files import atomic_write
    from tuner.store import kt

    if kt.is_cache_path(path):
        return _load_recording(path, study_name)
    digest = hashlib.sha256(f"{RECORDING_CACHE_VERSION}\0{study_name}\0".encode())
    for part in (Path(path), Path(f"{path}-wal")):
        try:
            digest.update(part.read_bytes())
        except FileNotFoundError:
            digest.update(b"\0no file\0")
        except OSError:
            return _load_recording(path, study_name)
    cached = cache_dir() / "recordings" / f"{digest.hexdigest()}.json"
    try:
        data = json.loads(cached.read_text())
        return {k: (state, attrs) for k, (state, attrs) in data["records"].items()}, data["attrs"], data["params"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # none yet, or damaged: read the recording
    records, attrs, names = _load_recording(path, study_name)
    try:
        atomic_write(cached, json.dumps({"records": records, "attrs": attrs, "params": names}), make_parents=True)
    except InputError:  # a cache dir that cannot be written: read the recording again next time
        pass
    return records, attrs, names


def _load_recording(
    path: str, study_name: str | None = None
) -> tuple[dict[str, tuple[str, dict[str, Any]]], dict[str, Any], list[str]]:
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    from tuner.store import kt
    from tuner.store.dbfiles import readonly_url

    if kt.is_cache_path(path):
        data = kt.read_cache(path)
        return kt.records(data, path), {StudyAttr.GPU: str(data.get("device_name", ""))}, list(data["tune_params_keys"])
    if path.endswith(".gz") and "://" not in path:
        return _load_gzipped_db(path, study_name)
    url = readonly_url(path)  # a recording is an input: never written, not even Optuna's tables
    try:
        storage = optuna.storages.RDBStorage(url, skip_compatibility_check=False)
        # the names alone: Optuna's study summaries read every trial of every study, as the study below does again
        names = optuna.get_all_study_names(storage)
    except (SQLAlchemyError, RuntimeError) as exc:  # not a database, or not Optuna's schema (version check)
        raise InputError(f"cannot read as a study database: {type(exc).__name__}", path) from None
    if not names:
        raise InputError("holds no study", path)
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


def load_records(path: str, study_name: str | None = None) -> dict[str, tuple[str, dict[str, Any]]]:
    """params key → (state, user attrs) for every replayable trial of a recording (see `load_recording`)."""
    return load_recording(path, study_name)[0]


def _load_gzipped_db(path: str, study_name: str | None):
    """`load_recording` of a gzipped SQLite study database (recordings are stored compressed), read from a
    temporary copy."""
    import gzip
    import shutil
    import tempfile
    import zlib

    if not Path(path).is_file():
        raise InputError("replay file not found", path)
    with tempfile.NamedTemporaryFile(suffix=".db", delete=False) as dst:
        tmp = dst.name
        try:
            with gzip.open(path, "rb") as src:
                shutil.copyfileobj(src, dst)
        except (OSError, EOFError, zlib.error) as exc:  # zlib.error: a gzip header over a damaged stream
            dst.close()
            Path(tmp).unlink(missing_ok=True)
            raise InputError(f"cannot decompress: {exc}", path) from None
    try:
        return _load_recording(tmp, study_name)
    finally:
        Path(tmp).unlink(missing_ok=True)


class ReplayPool(Pool):
    """The study driver's pool (`tuner.study.pool.Pool`) answering from a recording in this process: no Ray, no
    GPU, no worker to name. `in_flight` configs are outstanding at a time and answered first in, first out, as
    `in_flight` workers of equal speed would answer them, so a study sees the sampler's parallel-proposal
    behaviour without any waiting. Used to replay studies fast (benchmarks/search.py, tests)."""

    measures = False

    def __init__(self, problem, path: str, study_name: str | None = None, in_flight: int = 1):
        from collections import deque

        super().__init__(problem)
        self.replay = ReplayEvaluator(path, study_name)
        info = self.replay.start()
        self._capacity = max(1, in_flight)
        self.queue: deque[tuple[int, dict[str, Any]]] = deque()
        self._gpus = [{**info, "gpu_index": i} for i in range(self._capacity)]
        self._arch = info["arch"]
        #: the recorded results answered so far: what the recording says its GPU spent, not this process
        self._spent = Spent()
        self.started = time.perf_counter()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def in_flight(self) -> int:
        return len(self.queue)

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return self._gpus

    @property
    def arch(self) -> str:
        return self._arch

    def submit(self, number: int, params: dict[str, Any], budget_ms: float = 25.0, screening: bool = True) -> None:
        self.queue.append((number, params))

    def poll(self, timeout: float = 0.0) -> list[tuple[int, Result]]:
        """The oldest outstanding config's result (none when nothing is outstanding)."""
        if not self.queue:
            return []
        number, params = self.queue.popleft()
        result = self.replay.evaluate(EvaluateRequest(None, "", params, self.problem))
        self._spent.add(result)
        return [(number, result)]

    def spent(self) -> Spent:
        """The recorded results answered so far; no worker is ever occupied (answers come at once)."""
        return self._spent.copy()

    def close(self) -> None:
        self.queue.clear()

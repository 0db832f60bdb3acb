"""Opening a study: its identity, whether a stored study may be resumed or is complete already, and its trials.

`Opening` opens one study for the driver that holds it (`tuner.study.driver.Driver`), and owns what it opens;
`sampler_study` and `replay_history` make the driver's in-memory copy of the study. A stored study is resumed
only by the command that made it (the same space file, template, kernel, problem and objectives); one that holds
its trials already is said to be complete before anything starts, where its SQLite file tells; trials a killed
driver left RUNNING are failed as interrupted and their configs queued again.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tuner.build.render import templates_hash
from tuner.core.errors import InputError
from tuner.core.gpufacts import GpuFacts
from tuner.core.result import INTERRUPTED, StudyAttr, TrialAttr
from tuner.gpu.clock import since_command
from tuner.space.space import params_key
from tuner.store.artifacts import ArtifactWriter
from tuner.store.dbfiles import open_storage
from tuner.store.schema import SCREENED, counted_trials, counts
from tuner.store.writer import Mirror, new_study
from tuner.study.codec import Codec
from tuner.study.failures import evaluation_failed, tells_failures_as_worst, worst_values
from tuner.study.options import StudyOptions, default_study_name
from tuner.study.preflight import complete_line

if TYPE_CHECKING:
    import optuna
    from optuna.samplers import BaseSampler
    from optuna.storages import BaseStorage, InMemoryStorage

    from tuner.kernels.base import Family
    from tuner.space import space as space_mod
    from tuner.space.problem import Objective
    from tuner.store.lease import Lease
    from tuner.study.ahead import Ahead
    from tuner.study.engines import Engine


@dataclass
class Opened:
    """A study as the set-up opened it: its name, its stored trials, the configs a killed driver left unmeasured,
    how to set a study attr, its id in the storage (None where the writer creates it), the set-up's stamps, the
    seconds spent on the storage and its problem."""

    name: str
    past: list[Any]
    again: list[dict[str, Any]]
    set_study_attr: Callable[[str, Any], None]
    study_id: int | None
    stamps: dict[str, Any]
    storage_s: float
    #: the problem with the GPU facts its workers reported
    problem: space_mod.Problem


@dataclass
class Prelude:
    """What a study run as one of several (`tuner.study.shapes`: one per problem of a space) is given besides its
    options: the configs a new study measures first, in this order, instead of the space's default (the best
    configs of the problems tuned before it: they are also the sampler's first trials, so TPE models from them
    at once), the label of its progress bar, whether it prints its own end-of-study table (the runner prints one
    table for all problems instead), and whether another study follows it."""

    first: list[dict[str, Any]] = field(default_factory=list)
    label: str = "study"
    table: bool = True
    #: start the next study's writer process as soon as this one has taken its own (its imports then overlap
    #: this study instead of the next one's start)
    spare_writer: bool = False
    #: the study's pool, made by this (space, problem) → pool, instead of its engine's own: a share of one pool
    #: that several studies run over side by side (`tuner.study.sidebyside`)
    pool: Callable[[Any, Any], Any] | None = None
    #: the rich progress display its bar joins (one for all the studies side by side); None: its own
    bar: Any = None


class Opening:
    """Opens one study for its driver, which holds one (`tuner.study.driver.Driver.opening`): the study's identity
    and attrs, whether a stored study may be resumed (or is complete already, known before anything starts), the
    pool and the writer started for it, opening it and failing the trials a killed driver left RUNNING. It owns
    what it opens: the durable storage, the study's lease and the artifact writer, and the pool and the writer
    until the driver takes them over (`handed_over`). `space` is the space searched; `problem` follows the GPU
    facts the workers report (`open`)."""

    def __init__(
        self,
        opts: StudyOptions,
        url: str,
        storage_file: Path | None,
        space: space_mod.SearchSpace,
        problem: space_mod.Problem,
        objectives: list[Objective],
        prelude: Prelude,
        engine: Engine,
        ahead: Ahead,
        t0: float,
    ):
        self.opts, self.url, self.space, self.problem, self.objectives = opts, url, space, problem, objectives
        #: the storage's SQLite file (None: in memory or another database); it does not exist yet for a new study
        self.storage_file = storage_file
        self.family: Family = space.family
        self.prelude, self.engine, self.ahead, self.t0 = prelude, engine, ahead, t0
        self.storage: BaseStorage | None = None  # opened by `open`, once the pool is up
        self.lease: Lease | None = None
        self.artifacts: ArtifactWriter | None = None
        #: the pool and the writer started for the study (`start_pool`) that the driver has not taken over yet
        self.setting_up: tuple[Any, Any] | None = None

    def _identity_attrs(self) -> dict[str, Any]:
        """The user attrs that say which study this is, whatever GPU runs it: what a resumed study must match."""
        return {
            StudyAttr.KERNEL: self.space.kernel,
            StudyAttr.SPACE_HASH: self.space.content_hash(),
            StudyAttr.TEMPLATES_HASH: templates_hash(self.family),
            StudyAttr.PROBLEM: {"name": self.problem.name, "dtype": self.problem.dtype, "sizes": self.problem.sizes},
            "objectives": [[o.name, o.direction] for o in self.objectives],
        }

    def _study_attrs(self, gpu: str, arch: str, gpu_facts: dict[str, Any] | None) -> dict[str, Any]:
        """The user attrs a study is created with: what it tunes, where, and with what code."""
        from tuner.build.compile import versions

        attrs = {
            **self._identity_attrs(),
            StudyAttr.FAMILY: self.space.family_ref,
            StudyAttr.SPACE_PATH: str(self.space.path),
            StudyAttr.GPU: gpu,
            StudyAttr.ARCH: arch,
            "versions": versions(),
            StudyAttr.THROUGHPUT_UNIT: self.family.throughput_unit,
        }
        if gpu_facts is not None:
            attrs[StudyAttr.GPU_FACTS] = gpu_facts
        return attrs

    def _resume_refusal(self, name: str, old: dict[str, Any]) -> str | None:
        """Why the stored study `name` (its user attrs `old`) cannot be resumed by this command, or None."""
        attrs = self._identity_attrs()
        for key, what in ((StudyAttr.SPACE_HASH, "space file"), (StudyAttr.TEMPLATES_HASH, "kernel template")):
            if old.get(key) != attrs[key]:
                return (
                    f"study {name!r} was made with a different {what}; refusing to mix trials "
                    f"(use --study-name for a new study)"
                )
        if old.get("objectives") not in (None, attrs["objectives"]):
            return (
                f"study {name!r} searched {old['objectives']}, not {attrs['objectives']} "
                f"(--objectives {'all' if self.opts.objectives == 'first' else 'first'} resumes it, "
                f"or use --study-name)"
            )
        if any(old.get(key) != attrs[key] for key in (StudyAttr.KERNEL, StudyAttr.PROBLEM)):
            return f"study {name!r} is for another kernel or problem (use --study-name)"
        return None

    def _name_before_start(self) -> str | None:
        """The study's name where it is known before a worker reports its GPU: given, or built from the GPU the
        engine knows its workers will report (`tuner.study.engines.Engine.gpu_before_start`); None otherwise."""
        if self.opts.study_name:
            return self.opts.study_name
        gpu = self.engine.gpu_before_start()
        return None if gpu is None else default_study_name(self.space, self.problem, gpu)

    def complete_before_start(self) -> tuple[str, int] | None:
        """(name, counted trials) when the stored study this command resumes already holds `opts.trials` counted
        trials, read from its SQLite file before anything starts; None otherwise, or where it cannot be known yet
        (another database, a name that waits for the GPU: the driver checks again once the study is open). A study
        this command cannot resume is refused here, before any worker starts."""
        if self.storage_file is None:
            return None
        name = self._name_before_start()
        if name is None:
            return None
        found = counted_trials(self.storage_file, name)
        if found is None:
            return None
        counted, old = found
        refusal = self._resume_refusal(name, old)
        if refusal is not None:
            raise InputError(refusal, self.url)
        return (name, counted) if counted >= self.opts.trials else None

    def already_complete(self, name: str, counted: int) -> dict[str, Any]:
        """The summary of a study that held its trials before this run (nothing measured, nothing written); one
        line says so where progress is shown."""
        from tuner.store.dbfiles import sqlite_path

        where = sqlite_path(self.url) if self.url != ":memory:" else None
        if self.opts.progress:
            print(complete_line(name, counted, self.opts.trials, str(where or self.url)), file=sys.stderr)
        return {
            "study": name,
            "storage": self.url,
            "trials": counted,
            "complete_before_run": True,
            "measured_this_run": 0,
            "duplicates_this_run": 0,
            "failures_this_run": {},
            "screened_this_run": {},
            "wall_s": round(time.perf_counter() - self.t0, 3),
            "command_wall_s": since_command(),
            "gpus": [],
            "best": None,
            "finalists": [],
        }

    def _open_study(self, gpu: str, arch: str, gpu_facts: dict[str, Any] | None) -> optuna.Study:
        import optuna

        name = self._study_name(gpu)
        attrs = self._study_attrs(gpu, arch, gpu_facts)
        directions = [o.direction for o in self.objectives]
        storage = self.opened_storage()
        try:
            existing = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            existing = None
        if existing is not None:
            refusal = self._resume_refusal(name, existing.user_attrs)
            if refusal is not None:
                raise InputError(refusal, self.url)
            durable = existing
        else:
            durable = new_study(storage, name, directions, attrs, [o.name for o in self.objectives])
        return durable

    def _study_name(self, gpu: str) -> str:
        return self.opts.study_name or default_study_name(self.space, self.problem, gpu)

    def opened_storage(self) -> BaseStorage:
        assert self.storage is not None, "the durable storage opens in `open`"
        return self.storage

    def _recover(self, durable: optuna.Study) -> list[dict[str, Any]]:
        """Fail trials a killed driver left RUNNING; return their configs to run again."""
        from optuna.trial import TrialState

        again = []
        storage = self.opened_storage()
        study_id = storage.get_study_id_from_name(durable.study_name)
        for trial in durable.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
            storage.set_trial_user_attr(trial_id, TrialAttr.FAILURE, INTERRUPTED)
            storage.set_trial_user_attr(trial_id, TrialAttr.REASON, "the driver stopped before this finished")
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
            again.append(dict(trial.params))
        return again

    def _new_storage(self) -> bool:
        """Whether the study's storage is a SQLite file that does not exist yet (or in memory): a new study."""
        if self.url == ":memory:":
            return True
        return self.storage_file is not None and not self.storage_file.exists()

    # -- opening the study, replaying its history -----------------------------------------------------------------
    def start_pool(self):
        """The engine's pool and the writer process that mirrors the trials (none for an in-process study), both
        starting: the writer's imports and the GPU workers' start-up overlap the rest of the set-up."""
        mirror: Any = None  # Mirror (a process), or, made once the study is open, InlineMirror (in-process)
        if not self.opts.in_process:
            mirror = self.ahead.writer_for(self.url)  # its imports overlap the set-up (`Ahead.launch_writer`)
            self.setting_up = (None, mirror)
            if self.prelude.spare_writer:
                self.ahead.launch_writer()  # for the study that follows this one
        if self.prelude.pool is not None:
            pool = self.prelude.pool(self.space, self.problem)
        else:
            pool = self.engine.pool(self.space, self.problem, self._new_storage)
        self.setting_up = (pool, mirror)
        return pool, mirror

    def handed_over(self) -> None:
        """The driver has taken the pool and the writer over: stopping them is its part from here on."""
        self.setting_up = None

    def stop_set_up(self) -> None:
        """Stop the pool and the writer that `start_pool` started, while the driver has not taken them over."""
        if self.setting_up is not None:
            pool, mirror = self.setting_up
            self.setting_up = None
            if pool is not None:
                pool.close()
            if mirror is not None:
                mirror.abort()

    def release(self) -> None:
        """Give the study's lease back (held from before the first read of its trials to the end of the run)."""
        if self.lease is not None:
            self.lease.release()

    def open(self, pool, mirror) -> Opened:
        """Open (or have the writer create) the study once the GPU workers report their GPU: its name and the
        space's GPU facts (the problem `Opened` holds, the pool's too) follow from that GPU. A stored study is
        leased, and its interrupted trials failed."""
        import optuna

        from tuner.store.lease import acquire

        # A new study's storage is created by the writer process (`_create_study`), off the driver's path: opening
        # an Optuna storage is about a second of imports and schema set-up, which on a busy host (compile threads
        # beside it) took 2-2.5 s and was the last thing a small study waited for before its first result.
        created_by_writer = isinstance(mirror, Mirror) and self.url != ":memory:" and self._new_storage()
        t_storage = time.perf_counter()
        if self.url == ":memory:":
            self.storage = optuna.storages.InMemoryStorage()
        elif not created_by_writer:
            self.storage = open_storage(self.url)
        storage_s = time.perf_counter() - t_storage
        stamps = {"storage_opened_s": since_command()}
        gpu = pool.gpus[0]["gpu"]  # waits for the GPU workers
        stamps["workers_waited_s"] = since_command()
        t_storage = time.perf_counter()
        facts = pool.gpus[0].get("gpu_facts")
        if facts is not None:  # expressions of the space see this GPU's facts, not the defaults
            self.problem = pool.problem = dataclasses.replace(self.problem, gpu=GpuFacts.from_dict(facts))
        name = self._study_name(gpu)
        study_id = None
        if created_by_writer:
            assert isinstance(mirror, Mirror)
            mirror.create(
                {
                    "name": name,
                    "directions": [o.direction for o in self.objectives],
                    "attrs": self._study_attrs(gpu, pool.arch, facts),
                    "metric_names": [o.name for o in self.objectives],
                    "takeover": self.opts.takeover,
                    "pid": os.getpid(),
                }
            )
            again, past = [], []
            set_study_attr = mirror.set_study_attr
        else:
            if self.url != ":memory:":
                self.lease = acquire(self.url, name, self.opts.takeover)
            durable = self._open_study(gpu, pool.arch, facts)
            again = self._recover(durable)
            past = durable.get_trials(deepcopy=False)
            set_study_attr = durable.set_user_attr
            study_id = self.opened_storage().get_study_id_from_name(name)
            if mirror is not None:
                mirror.bind(study_id)  # the writer opens the storage while the rest of the set-up goes on
        storage_s += time.perf_counter() - t_storage
        stamps["study_opened_s"] = since_command()
        self.artifacts = ArtifactWriter(self.url) if pool.measures else None
        stamps["artifacts_s"] = since_command()
        return Opened(name, past, again, set_study_attr, study_id, stamps, storage_s, self.problem)


# ---------------------------------------------------------------------------------------------------------------
# the sampler's study: the driver's, made and told the stored trials as the study opens


def sampler_study(sampler: Any, objectives: list[Objective]) -> tuple[optuna.Study, InMemoryStorage, int]:
    """The in-memory study `sampler` works on: (the study, its storage, its id there)."""
    import optuna

    memory = optuna.storages.InMemoryStorage()
    directions = [o.direction for o in objectives]
    # ValidSetSampler offers BaseSampler's methods without subclassing it (importing tuner.study.validset imports
    # no Optuna), which Optuna, calling only those methods, accepts.
    fast = optuna.create_study(storage=memory, directions=directions, sampler=cast("BaseSampler", sampler))
    return fast, memory, memory.get_study_id_from_name(fast.study_name)


def replay_history(
    fast: optuna.Study, opened: Opened, codec: Codec, objectives: list[Objective], opts: StudyOptions
) -> tuple[dict[str, int], dict[str, int], int, list[float] | None]:
    """Tell the sampler's study `fast` the stored trials; (measured, failed, counted, worst): params key → the
    trial that measured it, params key → the trial whose evaluation failed (never evaluated again), the trials
    that count, and the worst values measured (`tuner.study.failures.worst_values`)."""
    from optuna.trial import TrialState

    measured: dict[str, int] = {}
    failed: dict[str, int] = {}
    measured_values: list[list[float]] = []
    for t in opened.past:
        if TrialAttr.DUPLICATE_OF in t.user_attrs or SCREENED in t.user_attrs:
            continue
        if t.state == TrialState.COMPLETE:
            measured.setdefault(params_key(t.params), t.number)
            measured_values.append(list(t.values))
        elif evaluation_failed(t):
            failed.setdefault(params_key(t.params), t.number)
    worst = worst_values(measured_values, [o.direction for o in objectives])
    sampler, inside = opts.sampler, opts.inside_valid_set

    def worst_for(t) -> list[float] | None:  # the worst values, for a failure this sampler is told as such
        kind = t.user_attrs.get(TrialAttr.FAILURE)
        return worst if kind is None or tells_failures_as_worst(sampler, inside, kind) else None

    told = (codec.sampler_trial(t, worst_for(t)) for t in opened.past)
    fast.add_trials([s for s in told if s is not None])
    opened.stamps["sampler_study_s"] = since_command()
    return measured, failed, sum(1 for t in opened.past if counts(t)), worst

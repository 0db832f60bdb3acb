"""The study driver: ask → evaluate → tell, with Optuna, over a `cluster.Pool`.

One process owns the study. Optuna samples from an in-memory copy of it (ask + tell ≈ 8 ms with TPE, against
≈ 75 ms on SQLite, which would starve the GPUs); a writer process mirrors every trial into the durable storage
(SQLite by default, any SQLAlchemy URL) in the same order, so trial numbers agree and the database is the record.
A trial is written as RUNNING when its config goes out and completed when its result comes back; if the driver
is killed, rerunning the same command fails the RUNNING leftovers ("interrupted"), re-enqueues their configs and
carries on to N trials without benchmarking any recorded config twice.

Per asked config, in order: a config that breaks a constraint is PRUNED (constraint value 1) before any work; a
config already measured is answered from its earlier trial (``duplicate_of``) without GPU time; a config already
in flight waits for that result; anything else goes to the pool.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import re
import sys
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tuner import kernels
from tuner.build.render import templates_hash
from tuner.errors import InputError
from tuner.gpu.clock import since_command
from tuner.gpu.protocol import CHECK_PHASES, PHASES, EvaluatorFactory, Spent
from tuner.gpufacts import GpuFacts
from tuner.preflight import check_storage, check_study_name, complete_line, counted_trials
from tuner.result import INTERRUPTED, Invalid, Result, StudyAttr, TrialAttr
from tuner.results.dbfiles import default_storage_url, storage_url
from tuner.search import Codec, IndexBuild, ValidIndex, ValidSetSampler, valid_index, worst_values
from tuner.space import limits
from tuner.space import space as space_mod
from tuner.space.space import params_key
from tuner.writer import _Mirror, new_study

if TYPE_CHECKING:
    import optuna
    from optuna.samplers import BaseSampler
    from optuna.storages import BaseStorage, RDBStorage

    from tuner.lease import Lease

SAMPLERS = limits.SAMPLERS
ENGINES = limits.ENGINES
CONSTRAINT_KEY = "space"
#: user attr of a proposal answered without evaluation; its value says why (invalid, duplicate, known_failure)
SCREENED = "screened"


@dataclass
class StudyOptions:
    kernel: str
    space: str
    trials: int
    storage: str | None = None
    study_name: str | None = None
    sampler: str = "tpe"
    seed: int | None = None
    gpus: int | None = None
    ray_address: str | None = None
    timeout: float = 60.0
    replay: str | None = None
    replay_study: str | None = None
    replay_delay_s: float = 0.0
    problem: str | None = None
    progress: bool = True
    #: after a proposal that cannot be measured (breaks a constraint, already measured or failed, in flight),
    #: measure the nearest unexplored valid config next (see `_Repair`); False: a uniform draw among them
    repair: bool = True
    #: numeric params as ordered (index) distributions for the sampler (see `tuner.search.Codec`)
    ordered: bool = True
    #: once the valid set is listed (and small enough to list), the sampler proposes only valid configs not yet
    #: measured, failed or in flight (`tuner.search.ValidSetSampler`); False: every proposal is screened and
    #: repaired by the driver instead
    inside_valid_set: bool = True
    #: answer replayed configs in this process (no Ray, no writer process): `replay_in_flight` configs in flight
    in_process: bool = False
    replay_in_flight: int = 1
    #: search only the configs the replay recording holds (`tuner.replay.recorded_subspace`): for a recording
    #: that covers part of the space, where a config it lacks has no answer
    replay_recorded_only: bool = False
    #: how many of the fastest configs to re-time with `final_budget_ms` at the end (not in replay)
    finalists: int = 5
    final_budget_ms: float = 300.0
    #: ... but no more than this many repetitions' worth of it (at the screening median): a median of 200
    #: flushed launches is steady, and 300 ms of a 0.15 ms kernel would be ~2,000 of them, ~0.5 s each finalist
    final_reps: int = 200
    #: multi-fidelity screening: a config whose 3-repetition estimate is over this many times the best median
    #: so far is reported from those 3 repetitions and not timed further (`tuner.gpu.timing.benchmark`); its figure
    #: steers the search, and the finalists are re-timed in full anyway. None: every config gets the budget
    screen_cutoff: float | None = 1.05
    #: timed work per config while screening (at least 10 repetitions; `tuner.gpu.timing.benchmark`); the finalists
    #: get `final_budget_ms`. Measured on an H200 (benchmarks/results/screen_fidelity-*-5ms-*): 5 ms against 25
    #: ms of transpose, softmax and GEMV configs agreed within 1.1% per config (median 0.1-0.4%, as 10 ms did), and
    #: the config picked by the 5 ms figure was the fastest by the 25 ms one, or within 0.1% of it (four or five of
    #: the fastest five held their place) — the finalists' re-timing decides among them. A GEMM-sized kernel
    #: (~3 ms) is held by the 10 repetitions, not by the budget
    screen_budget_ms: float = 5.0
    #: take the study over from a driver that holds its lease (see tuner.lease)
    takeover: bool = False
    #: what the sampler optimises: "first" = the space's first objective alone (throughput; the Pareto front of
    #: registers and SMEM is computed from all measured trials afterwards), "all" = every objective of the space
    objectives: str = "first"
    #: "local" (threads and GPU worker processes on this machine, no Ray) or "ray"; None: ray when
    #: `ray_address` is given, else local
    engine: str | None = None


# ---------------------------------------------------------------------------------------------------------------
# storage


def default_storage(kernel: str) -> str:
    """``sqlite:///studies/KERNEL.db``, relative to the working directory."""
    return default_storage_url(kernel)


def engine_of(opts: StudyOptions) -> str:
    """The engine a study runs on: `opts.engine`, else ray with a `ray_address`, else local."""
    return opts.engine or ("ray" if opts.ray_address else "local")


def open_storage(url: str) -> RDBStorage:
    """An Optuna RDBStorage; SQLite gets WAL from its first connection (`tuner.results.dbfiles.WalConnection`), so the
    storage's creation and the writer's commits stay cheap. Errors are InputErrors."""
    import optuna

    from tuner.results.dbfiles import check_storage, create_storage, is_read_only, sqlite_engine_kwargs

    path = check_storage(url)
    if path is not None:
        if path.parent and not path.parent.exists():
            try:
                path.parent.mkdir(parents=True)
            except OSError as exc:
                raise InputError(f"--storage {url}: cannot create {path.parent}: {exc.strerror}") from None
    try:
        storage = create_storage(
            lambda: optuna.storages.RDBStorage(url, engine_kwargs=sqlite_engine_kwargs(url), heartbeat_interval=None)
        )
    except Exception as exc:  # SQLAlchemy raises ArgumentError/OperationalError/...; all mean "cannot open"
        first = str(exc).strip().splitlines()[0][:200]
        if is_read_only(exc):
            raise InputError(f"--storage {url}: read-only database: it can be read, not written ({first})") from None
        raise InputError(f"--storage {url}: cannot open: {first}") from None
    return storage


def default_study_name(space: space_mod.SearchSpace, problem: space_mod.Problem, gpu: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{space.kernel}-{problem.label()}-{gpu}")


#: TPE's uniform start-up draws before it models (see make_sampler)
TPE_STARTUP = 5


#: TPE's candidates per proposal (Optuna's n_ei_candidates) with several configs in flight (see make_sampler) ...
TPE_CANDIDATES_IN_FLIGHT = 128
#: ... until this many configs are evaluated; then 24 again (the driver's `_narrow_sampler`)
TPE_WIDE_UNTIL = 100


def make_sampler(name: str, seed: int | None, n_objectives: int, in_flight: int = 1) -> BaseSampler:
    """The Optuna sampler `name` (one of SAMPLERS) for a study that keeps `in_flight` configs outstanding;
    InputError for an unknown one or a missing extra."""
    import optuna

    # Optuna 5 samplers read each trial's constraints (trial.set_constraint) themselves.
    if name == "tpe":
        # 5 start-up draws (Optuna's default is 10): drawn inside the valid set, TPE learns from evaluated configs
        # only, and on the GEMM recording it then reaches 0.98 of the optimum sooner (benchmarks/results/search/).
        # Configs in flight are told to TPE as bad ones (constant_liar, Optuna 5's default); with 8 in flight that
        # alone left GEMM at 25 evaluated configs 0.924 of the optimum against 0.954 one at a time (20 seeds).
        # 128 candidates per proposal instead of 24 made it 0.936 (0.939 vs 0.948 over 40 seeds), GEMV M=64
        # 0.905 vs 0.881, and no other budget or recorded space more than 0.004 below one at a time
        # (benchmarks/results/search/grid-inflight-candidates-2026-12-01). One at a time it cost GEMM (0.938 vs
        # 0.948 at 25, 40 seeds), so it is kept to several in flight; and to the first `TPE_WIDE_UNTIL` configs: the
        # gain is early (within 0.001 from 100 on), while scoring 128 candidates costs ~50% more sampler time per
        # proposal (GEMM replay, 300 trials: 10.9 vs 7.2 ms), which on the main job starved the GPU (47-48 s
        # instead of 37-40 s on an H200).
        candidates = 24 if in_flight <= 1 else TPE_CANDIDATES_IN_FLIGHT
        return optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            group=True,
            n_startup_trials=TPE_STARTUP,
            n_ei_candidates=candidates,
            constant_liar=True,
        )
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        try:
            return optuna.samplers.GPSampler(seed=seed)
        except ImportError as exc:
            raise InputError(f"--sampler gp needs {exc.name} (pip install torch scipy)") from None
    if name == "cmaes":
        if n_objectives > 1:
            raise InputError("--sampler cmaes handles one objective only; set one objective in the space")
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise InputError("--sampler cmaes needs the cmaes package (pip install cmaes)") from None
        return optuna.samplers.CmaEsSampler(seed=seed)
    raise InputError(f"--sampler {name}: unknown (choose from {', '.join(SAMPLERS)})")


# ---------------------------------------------------------------------------------------------------------------
# the driver


def _values(result, objectives, family) -> list[float]:
    figures = result.to_dict()
    figures["throughput"] = result.tflops if family.throughput_unit == "TFLOP/s" else result.tbps
    figures["time_ms"] = result.median_ms
    return [float(figures[o.name]) for o in objectives]


def _counts(trial) -> bool:
    """Trials that count towards --trials: configs evaluated, not the leftovers of a killed driver nor proposals
    answered without evaluation (``screened``: a constraint violation, a duplicate, a known failure)."""
    return (
        trial.state.is_finished()
        and trial.user_attrs.get(TrialAttr.FAILURE) != INTERRUPTED
        and SCREENED not in trial.user_attrs
    )


class Driver:
    """Runs one study to N counted trials. Construct, then `run()`; `summary` holds the outcome."""

    def __init__(self, opts: StudyOptions):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        self.t0 = time.perf_counter()
        self.t_imports = since_command()
        self.opts = opts
        if opts.trials < 1:
            raise InputError(f"--trials {opts.trials}: must be ≥ 1")
        if opts.sampler not in SAMPLERS:
            raise InputError(f"--sampler {opts.sampler}: unknown (choose from {', '.join(SAMPLERS)})")
        # The name and the storage before anything else: a study that could not be opened by its name again, or
        # could not record its trials, is refused before any work (`tuner.preflight`).
        check_study_name(opts.study_name)
        self.url = storage_url(opts.storage) if opts.storage is not None else default_storage(opts.kernel)
        # Checked (and probed with a write, rolled back) now, created only in run() once the pool is up: a refused
        # command leaves no database behind.
        #: the storage's SQLite file (None: in memory or another database); it does not exist yet for a new study
        self.storage_file = check_storage(self.url, opts.storage is not None) if self.url != ":memory:" else None
        if opts.space == opts.kernel and opts.kernel not in kernels.names():
            raise InputError(f"unknown kernel {opts.kernel!r} (known: {', '.join(kernels.names())})")
        self.space = space_mod.load(opts.space)
        if self.space.kernel != opts.kernel:
            raise InputError(f"space is for kernel {self.space.kernel!r}, not {opts.kernel!r}", str(self.space.path))
        self.problem = self.space.problem(opts.problem)
        self.family = self.space.family
        from tuner.kernels.custom import check_reference

        # Before anything is written. On a GPU the worker's first check runs the reference (once per input set,
        # where the data is) and a fault there stops the study; running it here too, on the host at full size,
        # would cost seconds and GBs at LLM sizes. A replay has no worker to run it: it is tried here.
        check_reference(self.space, self.problem, required=not opts.replay, run=bool(opts.replay))
        if opts.objectives not in ("first", "all"):
            raise InputError(f"--objectives {opts.objectives}: choose first or all")
        self.objectives = self.space.objectives[:1] if opts.objectives == "first" else self.space.objectives
        self.evaluator: EvaluatorFactory
        if opts.replay:
            from tuner.replay import ReplayEvaluator, later_knobs, recorded_configs

            replay = ReplayEvaluator(opts.replay, opts.replay_study)
            replay.later = later = later_knobs(self.space, replay.param_names)
            # Over the recording, not the space: a space may be far too large to enumerate.
            recorded = recorded_configs(self.space, replay.records)
            if not any(self.space.validate(c, self.problem) is None for c in recorded):
                raise InputError("replay file holds none of the space's configs", opts.replay)
            self.evaluator = functools.partial(
                ReplayEvaluator, opts.replay, opts.replay_study, opts.replay_delay_s, later=later
            )
            self.recording = replay  # the local engine's evaluators share it: a recording loads in ~0.5 s
            if opts.replay_recorded_only:
                from tuner.replay import recorded_subspace

                self.space = recorded_subspace(self.space, replay.records, self.problem)
            self.logical_gpus: int | None = opts.gpus or 1  # a machine without GPUs: Ray gets logical ones
        else:
            from tuner.gpu.evaluator import gpu_evaluator

            self.evaluator, self.logical_gpus = gpu_evaluator, None
        limits.replay_delay(opts.replay_delay_s)
        self.storage: BaseStorage | None = None  # opened by run(), once the pool is up
        self.lease: Lease | None = None
        self.codec = Codec(self.space.params, ordered=opts.ordered)
        self.sampler_s = 0.0
        # made now so a missing extra is refused before the pool starts; remade in run() for the pool's capacity
        self.sampler = self._make_sampler(1)
        #: (name, counted trials) of a study that holds its trials already: run() then starts nothing
        self.complete = self._complete_before_start()
        if self.complete is None:  # a complete study needs no GPU: it is said to be complete on any machine
            limits.gpus(opts.gpus, bool(opts.replay), opts.ray_address, engine_of(opts))

    def _narrow_sampler(self, fast) -> None:
        """From here on, TPE scores its usual 24 candidates per proposal (see TPE_WIDE_UNTIL)."""
        narrow = make_sampler(self.opts.sampler, self.opts.seed, len(self.objectives), 1)
        if isinstance(self.sampler, ValidSetSampler):
            self.sampler.base = narrow  # the wrapper keeps its valid set and what it knows is explored
        else:
            self.sampler = fast.sampler = narrow

    def _make_sampler(self, in_flight: int) -> BaseSampler | ValidSetSampler:
        sampler = make_sampler(self.opts.sampler, self.opts.seed, len(self.objectives), in_flight)
        if self.opts.inside_valid_set and self.opts.sampler != "grid":
            return ValidSetSampler(sampler, self.codec)
        return sampler

    # -- set-up -------------------------------------------------------------------------------------------------
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
        """The study's name where it is known before a worker reports its GPU: given, a replay's, or built from
        this machine's GPU model (`tuner.space.limits.local_gpu_model`) for GPUs of this machine; None otherwise."""
        if self.opts.study_name:
            return self.opts.study_name
        gpu: str | None
        if self.opts.replay:
            from tuner.replay import gpu_label

            gpu = gpu_label(self.opts.replay)
        elif self.opts.ray_address:
            gpu = None  # the cluster's GPUs: known once a worker there reports
        else:
            gpu = limits.local_gpu_model()
        return None if gpu is None else default_study_name(self.space, self.problem, gpu)

    def _complete_before_start(self) -> tuple[str, int] | None:
        """(name, counted trials) when the stored study this command resumes already holds `opts.trials` counted
        trials, read from its SQLite file before anything starts; None otherwise, or where it cannot be known yet
        (another database, a name that waits for the GPU: `_run` checks again once the study is open). A study
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

    def _already_complete(self, name: str, counted: int) -> dict[str, Any]:
        """The summary of a study that held its trials before this run (nothing measured, nothing written); one
        line says so where progress is shown."""
        from tuner.results.dbfiles import sqlite_path

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
        storage = self._opened_storage()
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

    def _opened_storage(self) -> BaseStorage:
        assert self.storage is not None, "the durable storage opens at the start of run()"
        return self.storage

    def _recover(self, durable: optuna.Study) -> list[dict[str, Any]]:
        """Fail trials a killed driver left RUNNING; return their configs to run again."""
        from optuna.trial import TrialState

        again = []
        storage = self._opened_storage()
        study_id = storage.get_study_id_from_name(durable.study_name)
        for trial in durable.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
            storage.set_trial_user_attr(trial_id, TrialAttr.FAILURE, INTERRUPTED)
            storage.set_trial_user_attr(trial_id, TrialAttr.REASON, "the driver stopped before this finished")
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
            again.append(dict(trial.params))
        return again

    def _make_pool(self):
        """The pool of `opts.engine` (see StudyOptions.engine), started; for the local engine the GPU workers
        start in the background and the space's default config compiles meanwhile."""
        opts = self.opts
        engine = opts.engine or ("ray" if opts.ray_address else "local")
        if engine not in ENGINES:
            raise InputError(f"--engine {engine}: unknown (choose from {', '.join(ENGINES)})")
        if engine == "local" and opts.ray_address:
            raise InputError("--engine local runs on this machine alone; drop --ray-address or use --engine ray")
        if engine == "ray":
            from tuner.cluster import Pool

            return Pool(
                self.space,
                self.problem,
                self.evaluator,
                gpus=opts.gpus,
                ray_address=opts.ray_address,
                timeout_s=opts.timeout,
                logical_gpus=self.logical_gpus,
            )
        from tuner.local import LocalPool, isolated_gpu_evaluator
        from tuner.space import limits

        if opts.replay:
            factory = functools.partial(_replay_copy, self.recording, opts.replay_delay_s)
            count = opts.gpus or 1
        else:
            factory = functools.partial(isolated_gpu_evaluator, timeout_s=opts.timeout)
            count = opts.gpus or limits.local_gpus() or 1
        # A replay without delay answers at once: answered in the driver's thread, in order (reproducible).
        pool = LocalPool(
            self.space, self.problem, factory, gpus=count, inline=bool(opts.replay) and not opts.replay_delay_s
        )
        if not opts.replay:
            # Compile while the GPU worker starts: the first configs the study will submit — the space's default
            # for a search, the first configs of the listing for a grid (three per compile thread: all of a small
            # grid). Not the worker's own kernels: the worker builds them itself at its start, un-niced; a compile
            # here, in the pool's niced threads beside the configs, did not have them ready sooner (measured with
            # the one-module build: the worker waited 0.58 s on its cache lock, as long as building them itself;
            # benchmarks/results/startup-2026-12-01-read-flush.md) and took a compile thread from the configs.
            from tuner.gpufacts import DEFAULT_ARCH

            first = [dict(self.space.default)]
            if opts.sampler == "grid":
                walk = self.space.enumerate(self.problem, budget=space_mod.WALK_BUDGET)
                try:
                    first = list(itertools.islice(walk, min(3 * pool.compile_slots, opts.trials)))
                except space_mod.WalkBudgetExceeded:  # the grid itself refuses such a space, with its message
                    first = []
            # A new study also measures them while it opens its storage (a GPU that is up has nothing else to do);
            # a resumed one may have measured them already, so it only compiles.
            new = self._new_storage()
            for params in first:
                pool.prefetch(params, DEFAULT_ARCH, evaluate=new, budget_ms=opts.screen_budget_ms)
        return pool

    def _new_storage(self) -> bool:
        """Whether the study's storage is a SQLite file that does not exist yet (or in memory): a new study."""
        if self.url == ":memory:":
            return True
        return self.storage_file is not None and not self.storage_file.exists()

    # -- the loop -----------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run the study; the study's lease (see tuner.lease) is held from before the first read of its trials
        to the end."""
        self._setting_up: tuple[Any, Any] | None = None
        if self.complete is not None:
            return self._already_complete(*self.complete)  # no pool, no writer, no lease: nothing to do
        try:
            return self._run()
        except BaseException:
            self._stop_set_up()  # refused during set-up: stop what was started for it
            raise
        finally:
            if self.lease is not None:
                self.lease.release()

    def _stop_set_up(self) -> None:
        """Stop the pool and the writer that the set-up started, while it has not handed them to the loop."""
        if self._setting_up is not None:
            pool, mirror = self._setting_up
            self._setting_up = None
            if pool is not None:
                pool.close()
            if mirror is not None:
                mirror.abort()

    def _run(self) -> dict[str, Any]:
        import optuna
        from optuna.trial import TrialState

        mirror: Any = None  # _Mirror (a process), or _InlineMirror for an in-process study
        # The valid set (for the repair of unmeasurable proposals) is listed, or read from the cache, beside the
        # set-up: with this process's problem (the default GPU facts), checked against the workers' facts below.
        index_build = IndexBuild(self.space, self.problem) if self.opts.sampler != "grid" else None
        if self.opts.in_process:
            from tuner.replay import ReplayPool

            if not self.opts.replay:
                raise InputError("an in-process study needs a replay recording")
            pool = ReplayPool(
                self.problem, self.opts.replay, self.opts.replay_study, in_flight=self.opts.replay_in_flight
            )
        else:
            mirror = _Mirror.for_storage(self.url)  # its imports overlap the set-up (`tuner.writer.launch_writer`)
            self._setting_up = (None, mirror)
            pool = self._make_pool()
        self._setting_up = (pool, mirror)
        # A new study's storage is created by the writer process (`_create_study`), off the driver's path: opening
        # an Optuna storage is about a second of imports and schema set-up, which on a busy host (compile threads
        # beside it) took 2-2.5 s and was the last thing a small study waited for before its first result.
        created_by_writer = isinstance(mirror, _Mirror) and self.url != ":memory:" and self._new_storage()
        t_storage = time.perf_counter()
        if self.url == ":memory:":
            self.storage = optuna.storages.InMemoryStorage()
        elif not created_by_writer:
            self.storage = open_storage(self.url)
        storage_s = time.perf_counter() - t_storage
        stamps = {"storage_opened_s": since_command()}
        gpu = pool.gpus[0]["gpu"]  # waits for the GPU workers
        stamps["workers_waited_s"] = since_command()
        from tuner.lease import acquire

        t_storage = time.perf_counter()
        facts = pool.gpus[0].get("gpu_facts")
        if facts is not None:  # expressions of the space see this GPU's facts, not the defaults
            self.problem = pool.problem = dataclasses.replace(self.problem, gpu=GpuFacts.from_dict(facts))
        study_name = self._study_name(gpu)
        if created_by_writer:
            assert isinstance(mirror, _Mirror)
            mirror.create(
                {
                    "name": study_name,
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
                self.lease = acquire(self.url, study_name, self.opts.takeover)
            durable = self._open_study(gpu, pool.arch, facts)
            again = self._recover(durable)
            past = durable.get_trials(deepcopy=False)
            set_study_attr = durable.set_user_attr
            study_id = self._opened_storage().get_study_id_from_name(study_name)
            if mirror is not None:
                mirror.bind(study_id)  # the writer opens the storage while the rest of the set-up goes on
        storage_s += time.perf_counter() - t_storage
        stamps["study_opened_s"] = since_command()
        self.artifacts = _ArtifactWriter(self.url) if pool.measures else None
        stamps["artifacts_s"] = since_command()

        memory = optuna.storages.InMemoryStorage()
        directions = [o.direction for o in self.objectives]
        # ValidSetSampler offers BaseSampler's methods without subclassing it (importing tuner.search imports no
        # Optuna), which Optuna, calling only those methods, accepts.
        wide = pool.capacity > 1 and self.opts.sampler == "tpe"
        if wide:  # the sampler suited to several configs in flight (make_sampler)
            self.sampler = self._make_sampler(pool.capacity)
        sampler = cast("BaseSampler", self.sampler)
        fast = optuna.create_study(storage=memory, directions=directions, sampler=sampler)
        stamps["sampler_study_made_s"] = since_command()
        self.memory, self.fast_id = memory, memory.get_study_id_from_name(fast.study_name)
        measured: dict[str, int] = {}  # params key → the trial that measured it
        failed: dict[str, int] = {}  # params key → the trial whose evaluation failed (never evaluated again)
        measured_values: list[list[float]] = []
        for t in past:
            if TrialAttr.DUPLICATE_OF in t.user_attrs or SCREENED in t.user_attrs:
                continue
            if t.state == TrialState.COMPLETE:
                measured.setdefault(params_key(t.params), t.number)
                measured_values.append(list(t.values))
            elif _evaluation_failed(t):
                failed.setdefault(params_key(t.params), t.number)
        self.worst = worst_values(measured_values, directions)
        fast.add_trials([s for s in (self.codec.sampler_trial(t, self.worst) for t in past) if s is not None])
        stamps["sampler_study_s"] = since_command()
        counted = sum(1 for t in past if _counts(t))
        target = self.opts.trials
        if counted >= target:  # complete already (its name waited for the GPU): nothing to ask, measure or write
            self._stop_set_up()
            return self._already_complete(study_name, counted)
        queued: set[str] = set()  # keys enqueued below: each config once
        for params in again:
            key = params_key(params)
            # A config interrupted in one trial may be measured in another (a duplicate): it is not run again.
            if key not in measured and key not in failed and key not in queued:
                queued.add(key)
                fast.enqueue_trial(self.codec.encode(params))
        if not past and self.opts.sampler != "grid":
            # A new study measures the space's default (a known-good config) first: a baseline the search
            # must beat, and a floor under what it reports.
            fast.enqueue_trial(self.codec.encode(dict(self.space.default)))
        repair = None
        running: dict[str, int] = {}  # params key → trial number in flight
        grid_left: int | None = None  # grid: configs still queued; the study ends when they are spent
        index_wait_s = 0.0
        index_pending = self.opts.sampler != "grid"  # the repair's valid set not yet taken (`take_index`)
        if self.opts.sampler == "grid":
            # Every valid config not yet evaluated, once (the interrupted ones are queued above already).
            done_keys = {params_key(t.params) for t in past if _counts(t)}
            for params in self.space.valid_configs(self.problem):
                key = params_key(params)
                if key not in done_keys and key not in queued:
                    queued.add(key)
                    fast.enqueue_trial(self.codec.encode(params))
            grid_left = sum(1 for t in fast.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
            target = min(target, counted + grid_left)
            stamps["grid_queued_s"] = since_command()

        def take_index() -> None:
            """Wait for the valid set (listed in the background, or read from the cache), then set up the repair
            and cap the target at the configs left to evaluate."""
            nonlocal repair, target, index_wait_s, index_pending
            index_pending = False
            t_index = time.perf_counter()
            assert index_build is not None
            index = index_build.result()
            if index_build.problem.expression_env != self.problem.expression_env:  # another GPU: list it for this
                index = valid_index(self.space, self.problem)
            index_wait_s = time.perf_counter() - t_index
            # Random search draws its replacements uniformly too: the nearest config would skew it towards the
            # edges of the valid set.
            repair = _Repair(index, self.opts.seed, nearest=self.opts.repair and self.opts.sampler != "random")
            if repair.complete:
                # Proposals that cannot be measured do not count: the study ends when the valid set is spent.
                unexplored = repair.size() - sum(1 for k in set(measured) | set(failed) if repair.contains(k))
                target = min(target, counted + unexplored)
                if isinstance(self.sampler, ValidSetSampler):
                    self.sampler.attach(repair, lambda: measured.keys() | failed.keys() | running.keys())

        # A new study's first config is the space default, enqueued above: it needs no repair, so it goes out
        # before the wait for the valid set, whose listing (seconds on a fresh machine) then overlaps its
        # measurement. The sampler's proposals are the same either way.
        if index_pending and (past or index_build is None or index_build.done()):
            take_index()
        if mirror is None:
            mirror = _InlineMirror(self._opened_storage(), study_id)
        check_writer = mirror.check if isinstance(mirror, _Mirror) else None
        self._setting_up = None
        dists = self.codec.sampler_dists
        trials: dict[int, Any] = {}
        waiting: dict[str, list] = defaultdict(list)  # duplicates of an in-flight config
        stats = _Stats(self.family.throughput_unit, past, gpu=self.problem.gpu)
        progress = _Progress(self.opts.progress, target, counted, stats, where=_where(study_name, self.url))
        first_result_at = None
        submitted = counted  # counted plus configs in flight
        drawn = False  # a proposal has been drawn in this run
        self._set_cutoff(pool, stats)  # a resumed study screens against its best so far from the start
        # "After start-up" counts from here: the pool is up and the study open, the first config goes out now.
        loop_started = time.perf_counter()
        try:
            with progress:
                while counted < target:
                    if check_writer is not None:
                        check_writer()  # a new study the writer could not create, or a writer that died
                    if grid_left == 0 and pool.in_flight == 0:
                        break  # every queued config is answered; a config that did not count is not re-drawn
                    while submitted < target and pool.in_flight < pool.capacity and grid_left != 0:
                        if index_pending and drawn:
                            take_index()  # the default is out; later proposals may need the repair
                            progress.set_total(target)
                            if submitted >= target:
                                break
                        drawn = True
                        if grid_left is not None:
                            grid_left -= 1
                        if wide and counted >= TPE_WIDE_UNTIL:
                            wide = False
                            self._narrow_sampler(fast)
                        started = time.perf_counter()
                        trial = fast.ask(dists)
                        self.sampler_s += time.perf_counter() - started
                        params = self.codec.decode(trial.params)
                        key = params_key(params)
                        mirror.start(trial.number, self.codec.record(self._frozen(trial.number)))
                        reason = self.space.validate(params, self.problem)
                        if reason is not None:
                            self._screen(trial, "invalid", stats)
                            self._tell(fast, mirror, trial, Invalid(reason=reason), stats)
                        elif key in measured:
                            self._screen(trial, "duplicate", stats)
                            self._tell_duplicate(fast, mirror, trial, measured[key], stats)
                        elif key in failed:
                            self._screen(trial, "known_failure", stats)
                            self._tell_duplicate(fast, mirror, trial, failed[key], stats)
                        elif key in running:
                            self._screen(trial, "duplicate", stats)
                            waiting[key].append(trial)
                        else:
                            running[key] = trial.number
                            trials[trial.number] = trial
                            pool.submit(trial.number, params, budget_ms=self.opts.screen_budget_ms)
                            submitted += 1
                            continue
                        # The proposal cannot be measured: measure the nearest unexplored valid config next.
                        if index_pending:
                            take_index()
                            progress.set_total(target)
                        nearest = (
                            repair.nearest(params, set(measured) | set(failed) | set(running))
                            if repair is not None
                            else None
                        )
                        if nearest is None:
                            break  # nothing unexplored is free now: wait for a result
                        fast.enqueue_trial(self.codec.encode(nearest))
                    for number, result in pool.poll():
                        first_result_at = first_result_at or time.perf_counter()
                        trial = trials.pop(number)
                        if number in pool.ran_on:
                            trial.set_user_attr(TrialAttr.WORKER_GPU_INDEX, pool.ran_on.pop(number))
                        ran_by = getattr(pool, "ran_by", {})  # an in-process replay has no workers
                        if number in ran_by:
                            trial.set_user_attr(TrialAttr.WORKER, ran_by.pop(number))
                        built = pool.built.pop(number, None)
                        if result.ok and built is not None and self.artifacts is not None:
                            self.artifacts.attach(trial, *built)
                        key = params_key(self.codec.decode(trial.params))
                        running.pop(key, None)
                        counted += self._tell(fast, mirror, trial, result, stats)
                        if not result.ok and result.details.get("phase") == "reference":
                            # The reference is every config's: its fault fails them all, so the study stops here.
                            raise InputError(result.reason, str(self.space.path))
                        (measured if result.ok else failed)[key] = trial.number
                        self._set_cutoff(pool, stats)
                        for dup in waiting.pop(key, []):
                            self._tell_duplicate(fast, mirror, dup, trial.number, stats)
                    progress.update(counted)
            loop_end = time.perf_counter()
            spent = pool.spent()  # before the finalists: their work falls after loop_end
            finalists = self._retime_finalists(fast, pool, set_study_attr) if pool.measures else []
            finalists_s = time.perf_counter() - loop_end
            wall = loop_end - self.t0
            started = loop_started
            gpus = pool.gpus
            measures, compile_threads = pool.measures, getattr(pool, "compile_slots", None)
            pool_startup = {
                "imports_s": round(self.t_imports, 3),
                "storage_s": round(storage_s, 3),
                # the set-up's wait for the valid set (listed beside the set-up, or read from the cache)
                "valid_index_wait_s": round(index_wait_s, 3),
                **stamps,
                **pool.startup,
                **_worker_startup(gpus),
                "study_ready_s": round(loop_started - self.t0 + self.t_imports, 3),
                "first_result_s": round(first_result_at - self.t0 + self.t_imports, 3) if first_result_at else None,
            }
        finally:
            pool.close()
            flush_started = time.perf_counter()
            writer = mirror.close()
        after_start = loop_end - started
        # The GPUs may have measured before the loop started (configs prefetched while the study opened).
        busy_window = loop_end - min(started, getattr(pool, "busy_since", None) or started)
        evaluated = stats.measured + sum(n for kind, n in stats.failures.items() if kind != "invalid")
        asked = len(fast.get_trials(deepcopy=False)) - len(past)
        summary = {
            "study": study_name,
            "storage": self.url,
            "trials": counted,
            "measured_this_run": stats.measured,
            "duplicates_this_run": stats.duplicates,
            # measured from the 3-repetition estimate alone: over `screen_cutoff` × the best so far
            "cut_short_this_run": stats.cut_short,
            "failures_this_run": dict(stats.failures),
            # Proposals answered without evaluation (not counted as trials), by why.
            "screened_this_run": dict(stats.screened),
            "sampler_ms_per_proposal": round(1000 * self.sampler_s / asked, 3) if asked else None,
            "wall_s": round(wall, 3),
            # From the process's start (the command), not from this object's: imports count too.
            "cold_start_s": round(first_result_at - self.t0 + self.t_imports, 3) if first_result_at else None,
            "gpus": gpus,
            "startup": pool_startup,
            **_time_split(spent, wall, busy_window, len(gpus), compile_threads, measures),
            "after_start_s": round(after_start, 3),
            "evaluated_per_s": round(evaluated / after_start, 3) if after_start > 0 else None,
            "finalists_s": round(finalists_s, 3),
            "writer_flush_s": round(time.perf_counter() - flush_started, 3),
            # What a user waits for, up to this summary: from the command's start (imports included) through the
            # search, the finalists' re-timing and the writer's last commit. `wall_s` is the driver's loop alone.
            "command_wall_s": since_command(),
            **({"writer": _writer_summary(writer)} if writer else {}),
            "best": stats.best,
            "finalists": finalists,
            # Configs that hung: what each cost its GPU and its deadline; the start-up of each worker replaced.
            "hangs": list(getattr(pool, "hangs", [])),
            "replacements_s": list(getattr(pool, "replacements_s", [])),
        }
        if finalists and "tbps" in finalists[0]:
            summary["best"] = {**finalists[0], "screening": stats.best}
        progress.final(summary)
        return summary

    # -- finalists ----------------------------------------------------------------------------------------------
    def _retime_finalists(self, fast, pool, set_study_attr) -> list[dict[str, Any]]:
        """Re-time the fastest configs with a longer budget on fresh inputs (verified again), so the figure a
        user reads or exports is not a screening figure. Recorded in the study's user attr "finalists"."""
        from optuna.trial import TrialState

        unit_key = "tflops" if self.family.throughput_unit == "TFLOP/s" else "tbps"
        measured = [
            t
            for t in fast.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if TrialAttr.DUPLICATE_OF not in t.user_attrs and TrialAttr.FAILURE not in t.user_attrs
        ]
        top = sorted(measured, key=lambda t: t.user_attrs[unit_key], reverse=True)[: self.opts.finalists]
        if not top:
            return []
        for i, t in enumerate(top):
            median_ms = t.user_attrs.get("median_ms")
            budget_ms = self.opts.final_budget_ms
            if median_ms:
                budget_ms = min(budget_ms, self.opts.final_reps * float(median_ms))
            pool.submit(-1 - i, self.codec.decode(t.params), budget_ms=budget_ms, screening=False)
        results: dict[int, Any] = {}
        while len(results) < len(top):
            for number, result in pool.poll():
                results[number] = result
        finalists = []
        for i, t in enumerate(top):
            r = results[-1 - i]
            entry = {
                "trial": t.number,
                "params": self.codec.decode(t.params),
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
        finalists.sort(key=lambda e: e.get(unit_key, -1.0), reverse=True)
        set_study_attr(StudyAttr.FINALISTS, finalists)
        return finalists

    def _set_cutoff(self, pool, stats: _Stats) -> None:
        """Screen later configs against the best median so far (`StudyOptions.screen_cutoff`)."""
        if self.opts.screen_cutoff and pool.measures and stats.best is not None:
            pool.cutoff_ms = self.opts.screen_cutoff * stats.best["median_ms"]

    # -- telling ------------------------------------------------------------------------------------------------
    def _frozen(self, number: int):
        """The fast study's trial `number` as it stands (a running one: params and start time)."""
        return self.memory.get_trial(self.memory.get_trial_id_from_study_id_trial_number(self.fast_id, number))

    def _screen(self, trial, why: str, stats: _Stats) -> None:
        trial.set_user_attr(SCREENED, why)
        stats.screened[why] += 1

    def _tell_sampler(self, fast, trial, values=None, state=None):
        started = time.perf_counter()
        frozen = fast.tell(trial, values, state=state)
        self.sampler_s += time.perf_counter() - started
        return frozen

    def _tell(self, fast, mirror, trial, result: Result, stats: _Stats) -> int:
        """Tell `result`; returns 1 when the trial counts towards --trials (it was evaluated), else 0."""
        params = self.codec.decode(trial.params)
        if result.ok:
            trial.set_constraint(CONSTRAINT_KEY, 0.0)
            for key, value in result.to_dict().items():
                trial.set_user_attr(key, value)
            trial.set_user_attr(
                TrialAttr.DERIVED,
                {k: v for k, v in self.space.resolve(params, self.problem).items() if k not in params},
            )
            trial.set_user_attr(TrialAttr.CONSTRAINT, 0.0)
            values = _values(result, self.objectives, self.family)
            self.worst = worst_values(
                [values] + ([self.worst] if self.worst else []), [o.direction for o in self.objectives]
            )
            frozen = self._tell_sampler(fast, trial, values)
            stats.add(trial.number, params, result)
        else:
            # Any failure is infeasible for the sampler, and told with the worst values so far so that every
            # sampler learns from it (see tuner.search); the record keeps PRUNED/FAIL.
            trial.set_constraint(CONSTRAINT_KEY, 1.0)
            trial.set_user_attr(TrialAttr.CONSTRAINT, 1.0)
            trial.set_user_attr(TrialAttr.FAILURE, result.kind)
            trial.set_user_attr(TrialAttr.REASON, result.reason)
            frozen = self._tell_failure(fast, trial, result.kind)
            stats.fail(result.kind)
        mirror.finish(trial.number, self.codec.record(frozen))
        return 0 if SCREENED in trial.user_attrs else 1

    def _tell_failure(self, fast, trial, kind: str):
        from optuna.trial import TrialState

        if self.worst is not None:
            return self._tell_sampler(fast, trial, list(self.worst))
        # nothing measured yet: no value to tell; the sampler skips the trial
        return self._tell_sampler(fast, trial, state=TrialState.PRUNED if kind == Invalid.kind else TrialState.FAIL)

    def _tell_duplicate(self, fast, mirror, trial, original: int, stats: _Stats) -> int:
        """Answer `trial` from trial `original` of the same config (measured or failed) without evaluating."""
        first = self._frozen(original)
        for key, value in first.user_attrs.items():
            if key not in (TrialAttr.ARTIFACTS, SCREENED):  # the original's artifacts belong to the original
                trial.set_user_attr(key, value)
        trial.set_user_attr(TrialAttr.DUPLICATE_OF, original)
        if TrialAttr.FAILURE in first.user_attrs:
            trial.set_constraint(CONSTRAINT_KEY, 1.0)
            frozen = self._tell_failure(fast, trial, first.user_attrs[TrialAttr.FAILURE])
        else:
            trial.set_constraint(CONSTRAINT_KEY, 0.0)
            frozen = self._tell_sampler(fast, trial, list(first.values))
            stats.duplicates += 1
        mirror.finish(trial.number, self.codec.record(frozen))
        return 0 if SCREENED in trial.user_attrs else 1


def _writer_summary(stats: dict[str, Any]) -> dict[str, Any]:
    """The writer process's timings (`_writer_main`) in seconds from the command's start, with its cost per trial
    written."""
    out = _stamps_from_command({k: v for k, v in stats.items() if k.endswith("_at")})
    out["trials_written"] = stats["trials"]
    out["ms_per_trial"] = round(1000 * stats["write_s"] / stats["trials"], 2) if stats["trials"] else None
    return out


def _stamps_from_command(stamps: dict[str, Any]) -> dict[str, Any]:
    """Another process's "<stage>_at" `perf_counter` stamps as "<stage>_s" from the command's start
    (`tuner.gpu.clock`); other entries as they are."""
    return {
        (k.removesuffix("_at") + "_s" if k.endswith("_at") else k): (since_command(v) if k.endswith("_at") else v)
        for k, v in stamps.items()
    }


def _evaluation_failed(trial) -> bool:
    """A recorded trial whose evaluation failed (compile, launch, wrong result, timeout, or an invalid answer of
    the evaluator), as opposed to an interrupted one."""
    kind = trial.user_attrs.get(TrialAttr.FAILURE)
    return trial.state.name in ("FAIL", "PRUNED") and kind is not None and kind != INTERRUPTED


class _InlineMirror:
    """`_Mirror` without a process: writes each trial into `storage` at once (in-process replay studies)."""

    def __init__(self, storage, study_id: int):
        self.storage, self.study_id = storage, study_id
        self.trial_ids: dict[int, int] = {}

    def start(self, number: int, frozen) -> None:
        self.trial_ids[number] = self.storage.create_new_trial(self.study_id, template_trial=frozen)

    def finish(self, number: int, frozen) -> None:
        trial_id = self.trial_ids[number]
        for key, value in frozen.user_attrs.items():
            self.storage.set_trial_user_attr(trial_id, key, value)
        for key, value in frozen.system_attrs.items():
            self.storage.set_trial_system_attr(trial_id, key, value)
        self.storage.set_trial_state_values(trial_id, frozen.state, frozen.values)

    def close(self, timeout: float = 0.0) -> dict[str, Any]:
        return {}


class _ArtifactWriter:
    """Uploads a measured trial's rendered source (``<uri>.cu``) and PTX (``<uri>.ptx``) with
    `optuna.artifacts.upload_artifact` while the trial still runs (before `tell`), into the artifact folder
    beside a SQLite study (`<db stem>.artifacts/`, where `tuner dashboard` serves them from); the ids go into
    the trial's "artifacts" user attr. Nothing is attached for a storage that is not a SQLite file."""

    def __init__(self, url: str):
        from tuner.results.studies import artifact_dir_for

        self.folder = artifact_dir_for(url)
        self.store = None
        if self.folder is not None:
            from optuna.artifacts import FileSystemArtifactStore

            self.folder.mkdir(parents=True, exist_ok=True)
            self.store = FileSystemArtifactStore(self.folder)

    def attach(self, trial, source, compiled) -> None:
        import tempfile

        from optuna.artifacts import upload_artifact

        if self.store is None or not compiled.ptx:
            return
        ids = {}
        with tempfile.TemporaryDirectory() as tmp:
            for kind, ext, data in (("source", "cu", source.text.encode()), ("ptx", "ptx", compiled.ptx)):
                path = Path(tmp) / f"{source.uri}.{ext}"
                path.write_bytes(data)
                ids[kind] = upload_artifact(
                    artifact_store=self.store, file_path=str(path), study_or_trial=trial, mimetype="text/plain"
                )
        trial.set_user_attr(TrialAttr.ARTIFACTS, ids)


class _Repair:
    """The config to measure after a proposal that cannot be measured.

    In a sparse space (GEMV: 1% of the Cartesian product is valid) a sampler proposes many configs that break a
    constraint, and once it converges it proposes configs already measured (or known to fail). Each such
    proposal is still told to the sampler (so it learns where the feasible, unexplored region is), and the next
    trial measures the valid config closest to the proposal: fewest steps along each param's ordered list of
    values (L1 over value indices), ties broken by a seeded draw, configs already measured, failed or in flight
    skipped. With `nearest` False, a uniform draw among those configs instead. The valid set is
    `tuner.search.ValidIndex` (a space too large to list within `space.WALK_BUDGET` gets no repair).
    """

    def __init__(self, index: ValidIndex, seed: int | None, nearest: bool = True):
        import numpy as np

        self.rng = np.random.default_rng(seed)
        self.use_nearest = nearest
        self.index = index
        #: whether the index is the whole valid set (else the space is too large to list, and the sampler alone
        #: finds valid configs)
        self.complete = index.complete
        # Value indices, one contiguous column per param: "nearest" counts steps along each param's declared
        # values, summed column by column (a few ms over GEMM's 268k configs, where a row-wise sum takes 13).
        self.columns = [np.ascontiguousarray(index.rows[:, j]) for j in range(index.rows.shape[1])]

    def size(self) -> int:
        return len(self.index)

    def contains(self, key: str) -> bool:
        return self.index.row_of(key) is not None

    def draw(self, exclude: set[str]) -> dict[str, Any] | None:
        """A uniform draw among the valid configs not in `exclude` (keys), or None when none is left."""
        count = len(self.index)
        if not count:
            return None
        # A few rejection draws first: cheap while most of the set is unexplored (GEMM: 268k configs).
        for _ in range(16):
            row = int(self.rng.integers(count))
            config = self.index.config(row)
            if params_key(config) not in exclude:
                return config
        return self._pick(self.rng.random(count), exclude)

    def nearest(self, params: dict[str, Any], exclude: set[str]) -> dict[str, Any] | None:
        import numpy as np

        count = len(self.index)
        if self.use_nearest:
            steps = np.zeros(count, dtype=np.int32)
            for column, at in zip(self.columns, self.index.point(params), strict=True):
                steps += np.abs(column - np.int16(at))
            distance = steps.astype(np.float64)
            distance += self.rng.random(count) * 0.5  # seeded tie-break below one step
        else:
            distance = self.rng.random(count)
        if not count:
            return None
        return self._pick(distance, exclude)

    def _pick(self, distance, exclude: set[str]) -> dict[str, Any] | None:
        """The config of least `distance` (one per row) whose key is not in `exclude`."""
        import numpy as np

        count = len(self.index)
        rows = {r for r in map(self.index.row_of, exclude) if r is not None}
        if len(exclude) < count // 2:
            k = min(4 * len(exclude) + 64, count)
            # The k nearest in order, without sorting the whole set (hundreds of thousands of rows in GEMM).
            head = np.argpartition(distance, k - 1)[:k] if k < count else np.arange(count)
            for i in head[np.argsort(distance[head])].tolist():
                if i not in rows:
                    return self.index.config(i)
        free = np.ones(count, dtype=bool)
        free[list(rows)] = False
        if not free.any():
            return None
        distance[~free] = np.inf
        return self.index.config(int(np.argmin(distance)))


def _replay_copy(recording, delay_s: float, gpu_index: int):
    """A replay evaluator for logical GPU `gpu_index` that shares `recording`'s loaded records (read-only)."""
    import copy

    evaluator = copy.copy(recording)
    evaluator.delay_s, evaluator.gpu_index = delay_s, gpu_index
    return evaluator


def _worker_startup(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """The first GPU worker's own start-up stages (context, CuPy warm-up, ceiling: measured or cached)."""
    stages = gpus[0].get("startup") if gpus else None
    if not stages:
        return {}
    # "<stage>_at": the worker's perf_counter stamps (`tuner.gpu.clock`) → "<stage>_s" from the command
    return {"gpu_worker": _stamps_from_command(stages)}


# ---------------------------------------------------------------------------------------------------------------
# progress and summary


class _Stats:
    def __init__(self, unit: str, past, gpu: GpuFacts | None = None):
        self.unit = unit
        self.gpu = gpu  # the facts of the GPU measured on (the FP32 peak of a compute-bound family's live line)
        self.measured = 0
        self.duplicates = 0
        self.failures: Counter[str] = Counter()
        self.screened: Counter[str] = Counter()
        self.cut_short = 0  # measurements cut off after the estimate (fewer than the protocol's 10 repetitions)
        self.best: dict[str, Any] | None = None
        self.sm_clock_mhz: float | None = None  # the max SM clock the measurements report: the FP32 peak's
        for t in past:
            if t.state.name == "COMPLETE" and TrialAttr.DUPLICATE_OF not in t.user_attrs:
                self._consider(t.number, t.params, t.user_attrs)

    def _consider(self, number, params, figures) -> None:
        self.sm_clock_mhz = (figures.get("clocks") or {}).get("sm_clock_max_mhz") or self.sm_clock_mhz
        key = {"TFLOP/s": "tflops", "TB/s": "tbps"}.get(self.unit)
        if key is None:  # a family without a throughput (replay-only): the shortest time is the best
            better = self.best is None or figures["median_ms"] < self.best["median_ms"]
        else:
            better = self.best is None or figures[key] > self.best[key]
        if better:
            self.best = {
                "trial": number,
                "params": dict(params),
                "uri": figures.get("uri"),
                "tbps": figures["tbps"],
                "tflops": figures["tflops"],
                "median_ms": figures["median_ms"],
                "fraction_of_ceiling": figures["fraction_of_ceiling"],
                "registers": figures["registers"],
                "smem_bytes": figures["smem_bytes"],
            }

    def add(self, number, params, result) -> None:
        self.measured += 1
        self.cut_short += result.repetitions < 10
        self._consider(number, params, result.to_dict())

    def fail(self, kind: str) -> None:
        self.failures[kind] += 1

    def fp32_peak(self) -> float | None:
        """The FP32 peak in TFLOP/s of the GPU measured on, at the max SM clock its measurements report
        (`tuner.gpufacts.fp32_peak_tflops`); None where either is unknown."""
        from tuner.gpufacts import fp32_peak_tflops

        return fp32_peak_tflops(self.gpu, self.sm_clock_mhz) if self.gpu is not None else None


def _where(study: str, url: str) -> str:
    """The line that says where a study's trials go, printed as it starts."""
    from tuner.results.dbfiles import sqlite_path

    path = sqlite_path(url)
    return f"study {study}: trials go to {path if path is not None else url}"


#: the stages of `summary["startup"]` that run one after the other until the GPU workers are up, for people (the
#: others overlap them, or are moments counted from the command's start)
_STAGES = {"imports_s": "imports", "ray_init_s": "Ray", "gpu_workers_s": "workers"}


def _first_seconds(summary: dict[str, Any], replay: bool) -> str:
    """What the seconds before the first result went to: start-up (its stages), then the first config."""
    from tuner.results.console import human_seconds

    cold = summary.get("cold_start_s")
    stages = {
        k: float(v) for k, v in (summary.get("startup") or {}).items() if k in _STAGES and isinstance(v, (int, float))
    }
    startup = sum(stages.values())
    order = sorted(stages, key=lambda k: (list(_STAGES).index(k) if k in _STAGES else len(_STAGES), k))
    parts = ", ".join(
        f"{_STAGES.get(k, k.removesuffix('_s').replace('_', ' '))} {human_seconds(stages[k])}" for k in order
    )
    text = f"start-up {human_seconds(startup)}" + (f" ({parts})" if parts else "")
    if cold is None:
        return text + "; no result came back"
    first = (
        "opening the study and answering the first config"
        if replay
        else "opening the study, compiling and measuring the first config"
    )
    return f"first result at {human_seconds(cold)}: {text}, then {human_seconds(max(cold - startup, 0.0))} {first}"


def _time_split(
    spent: Spent, wall_s: float, window_s: float, gpus: int, compile_threads: int | None, measures: bool
) -> dict[str, Any]:
    """The summary's account of where the search's time went (finalists excluded), from the pool's `Spent`.

    * "gpu_busy_fraction": the GPU time of the configs' own launches (Σ `Measurement.gpu_ms`: checked launch and
      timed repetitions) over the GPU window × GPUs: the time the GPUs ran work, not the time a worker held them.
      None for a replay (its GPU time is the recording's, not this run's) and where no measurement reported its
      GPU time; a lower bound where "gpu_time_missing" (measurements that reported none) is above 0. "gpu_s" is
      the sum itself.
    * "workers_busy_fraction": the time the workers spent inside ``evaluate`` (GPU work, host work and waits
      alike) over the same window × GPUs; for a replay, the only figure of the three. "gpu_window_s": the window,
      from the first evaluation (a GPU may measure before the search starts) to the end of the search.
    * "phases_s": seconds summed over this run's results: "compile" (every compile, over the pool's
      "compile_threads") and the evaluation's stages (`tuner.gpu.protocol.PHASES`, where the evaluator reports them;
      the checks' failures included). None for a replay.
    * "phases_share": "compile" of the wall × compile threads; "check" (`tuner.gpu.protocol.CHECK_PHASES`) and
      "timing" of the GPU window × GPUs, the denominator of the busy fractions. None for a replay.
    """
    lanes = window_s * gpus
    out: dict[str, Any] = {
        "gpu_busy_fraction": None,
        "gpu_s": None,
        "gpu_time_missing": None,
        "workers_busy_fraction": round(spent.occupied_s / lanes, 3) if lanes > 0 else None,
        "gpu_window_s": round(window_s, 3),
        "compile_threads": compile_threads,
        "phases_s": None,
        "phases_share": None,
    }
    if not measures:
        return out
    out["gpu_time_missing"] = spent.gpu_untimed
    if spent.gpu_timed:
        out["gpu_s"] = round(spent.gpu_s, 3)
        out["gpu_busy_fraction"] = round(spent.gpu_s / lanes, 3) if lanes > 0 else None
    stages = [k for k in PHASES if k in spent.phases_s] + sorted(set(spent.phases_s) - set(PHASES))
    out["phases_s"] = {"compile": round(spent.compile_s, 3), **{k: round(spent.phases_s[k], 3) for k in stages}}
    share: dict[str, float] = {}
    if compile_threads and wall_s > 0:
        share["compile"] = round(spent.compile_s / (wall_s * compile_threads), 3)
    if stages and lanes > 0:
        share["check"] = round(sum(spent.phases_s.get(k, 0.0) for k in CHECK_PHASES) / lanes, 3)
        share["timing"] = round(spent.phases_s.get("timing", 0.0) / lanes, 3)
    out["phases_share"] = share
    return out


class _Progress:
    """A rich progress bar: trials done/N, best so far, trials/s, failures by kind; `where` (where the trials
    go) is printed above it as the study starts."""

    def __init__(self, enabled: bool, total: int, done: int, stats: _Stats, where: str = ""):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.stats, self.started, self.done0 = stats, time.perf_counter(), done
        self.enabled, self.where = enabled, where
        self.bar = Progress(
            TextColumn("[bold]study"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=self.console,
            disable=not enabled,
        )
        self.task = self.bar.add_task("study", total=total, completed=done, info="")

    def __enter__(self):
        if self.enabled and self.where:
            self.console.print(self.where, soft_wrap=True, highlight=False, markup=False)
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        self.bar.__exit__(*exc)

    def set_total(self, total: int) -> None:
        """The study's target, once the valid set has capped it."""
        self.bar.update(self.task, total=total)

    def update(self, done: int) -> None:
        s = self.stats
        rate = (done - self.done0) / max(time.perf_counter() - self.started, 1e-9)
        best = f"best {_live_figure(s.unit, s.best, s.fp32_peak())}" if s.best else ""
        fails = " ".join(f"{k}:{v}" for k, v in sorted(s.failures.items()))
        self.bar.update(self.task, completed=done, info=f"{best}  {rate:.1f} trials/s  {fails}")

    def final(self, summary: dict[str, Any]) -> None:
        """The end-of-study table: where, how many, what the time went to, the best config in the family's own
        unit against its own roof (`_summary_figure`)."""
        from rich.table import Table
        from rich.text import Text

        from tuner.results.console import human_seconds

        if not self.enabled:
            return
        replay = any(str(g.get("gpu", "")).startswith("replay:") for g in summary.get("gpus") or [])
        table = Table(title=f"study {summary['study']}", show_header=False)
        table.add_column(no_wrap=True)
        table.add_column(overflow="fold")
        table.add_row("stored in", Text(summary["storage"]))
        table.add_row(
            "trials",
            f"{summary['trials']} ({summary['measured_this_run']} measured this run, "
            f"{summary['duplicates_this_run']} answered from earlier trials)",
        )
        if summary["failures_this_run"]:
            table.add_row("failures", ", ".join(f"{k}: {v}" for k, v in summary["failures_this_run"].items()))
        table.add_row("wall time", f"{human_seconds(summary['wall_s'])}; {_first_seconds(summary, replay)}")
        if replay:
            occupied = summary.get("workers_busy_fraction")
            if occupied:  # an in-process replay has no workers to be busy
                table.add_row("replay workers busy", f"{occupied:.0%}")
        elif "gpu_busy_fraction" in summary:
            table.add_row("GPU busy", _gpu_busy_text(summary))
            if summary.get("phases_s"):
                table.add_row("time in", _time_in_text(summary))
        best = summary["best"]
        if best:
            figure = _summary_figure(self.stats.unit, best, summary, self.stats.sm_clock_mhz)
            table.add_row("best", Text(best["uri"] or str(best["params"])))
            table.add_row("", f"{figure}, {best['registers']} registers, {best['smem_bytes']} B SMEM")
        # Wide enough for the uri and the storage whole: they are copied from here.
        width = max(self.console.width, len(str(best["uri"] if best else "")) + 30, len(summary["storage"]) + 30)
        self.console.print(table, width=width)


def _live_figure(unit: str, best: dict[str, Any], fp32_peak: float | None = None) -> str:
    """The best config's figure on the live line, against its own roof: a memory-bound family's TB/s with its
    share of the copy ceiling; a compute-bound family's TFLOP/s with its share of the FP32 peak (`fp32_peak`,
    from the GPU's facts; alone where that is unknown: a byte ceiling says nothing of FLOPs); a family without a
    throughput, its time."""
    if unit == "TB/s":
        return f"{best['tbps']:.2f} TB/s ({best['fraction_of_ceiling']:.2f}× ceiling)"
    if unit == "TFLOP/s":
        share = f" ({best['tflops'] / fp32_peak:.2f}× FP32 peak)" if fp32_peak else ""
        return f"{best['tflops']:.1f} TFLOP/s{share}"
    return f"{best['median_ms']:.4g} ms"


def _summary_figure(unit: str, best: dict[str, Any], summary: dict[str, Any], sm_clock_mhz: float | None) -> str:
    """The summary's figure of the best config, against its own roof: a memory-bound family's TB/s with its share
    of the copy ceiling measured on the GPU; a compute-bound family's TFLOP/s with its share of the FP32 peak that
    the GPU's facts (`summary["gpus"]`: SM count, arch) and the measurements' max SM clock give, said to be from
    the facts (no peak is measured), or no share where the facts were not read from a GPU."""
    from tuner.gpufacts import GpuFacts, fp32_peak_tflops

    if unit == "TB/s":
        return f"{best['tbps']:.3f} TB/s, {best['fraction_of_ceiling']:.2f}× the copy ceiling"
    if unit != "TFLOP/s":
        return f"{best['median_ms']:.4g} ms"
    facts = GpuFacts.from_dict(next((g.get("gpu_facts") for g in summary.get("gpus") or []), None))
    peak = fp32_peak_tflops(facts, sm_clock_mhz)
    if peak is None:
        return f"{best['tflops']:.1f} TFLOP/s (no FP32 peak to compare with: the GPU's facts or clock are unknown)"
    return (
        f"{best['tflops']:.1f} TFLOP/s, {best['tflops'] / peak:.2f}× the FP32 peak ({peak:.1f} TFLOP/s from the "
        f"GPU's facts: {facts.sm_count} SMs at {sm_clock_mhz:g} MHz, not measured)"
    )


def _gpu_busy_text(summary: dict[str, Any]) -> str:
    """The summary's "GPU busy" row: the GPUs' share of work, beside the workers' share of occupied time."""
    busy, occupied = summary.get("gpu_busy_fraction"), summary.get("workers_busy_fraction")
    workers = f"workers occupied {occupied:.0%}" if occupied is not None else ""
    if busy is None:
        return "n/a: no measurement reported its GPU time" + (f" ({workers})" if workers else "")
    missing = summary.get("gpu_time_missing") or 0
    text = (f"≥ {busy:.0%}" if missing else f"{busy:.0%}") + f" ({summary['gpu_s']:.3g} s running the configs"
    text += f"; {missing} measurements reported no GPU time" if missing else ""
    return text + (f"; {workers})" if workers else ")")


def _time_in_text(summary: dict[str, Any]) -> str:
    """The summary's "time in" row: compile, check (by stage) and timing, in seconds and as shares (see
    `_time_split`)."""
    from tuner.results.console import human_seconds

    phases, share = summary["phases_s"], summary.get("phases_share") or {}
    threads = summary.get("compile_threads")
    compile_share = f" ({share['compile']:.0%} of {threads} threads)" if "compile" in share else ""
    parts = [f"compile {human_seconds(phases['compile'])}{compile_share}"]
    if "check" in share:
        stages = ", ".join(f"{k} {human_seconds(phases[k])}" for k in CHECK_PHASES if k in phases)
        check = sum(phases.get(k, 0.0) for k in CHECK_PHASES)
        parts.append(f"check {human_seconds(check)} ({share['check']:.0%} of the GPU window: {stages})")
        parts.append(f"timing {human_seconds(phases.get('timing', 0.0))} ({share['timing']:.0%})")
    else:
        parts.append("check and timing n/a (the evaluator reported no stages)")
    return " · ".join(parts)


def run_study(opts: StudyOptions) -> dict[str, Any]:
    return Driver(opts).run()


# `tuner.study(space, trials=...)` is the API call `tuner.api.study`; the module stays importable as ever.
from tuner.api import callable_module as _callable_module  # noqa: E402

_callable_module(__name__)

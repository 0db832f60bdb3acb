"""The study driver: ask → evaluate → tell, with Optuna, over an engine's pool (`tuner.study.engines`).

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

import time
import warnings
from collections import defaultdict
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner import kernels
from tuner.build.child import quiet_after_interrupt
from tuner.core.errors import InputError
from tuner.core.result import Invalid, Result, TrialAttr
from tuner.gpu.clock import since_command
from tuner.space import space as space_mod
from tuner.space.space import params_key
from tuner.store.dbfiles import study_storage_url
from tuner.store.probe import check_storage
from tuner.store.schema import SCREENED, counts
from tuner.store.writer import InlineMirror, Mirror, close_writer
from tuner.study.ahead import Ahead
from tuner.study.codec import CONSTRAINT_KEY, Codec
from tuner.study.engines import Engine
from tuner.study.failures import tells_failures_as_worst, worst_values
from tuner.study.finalists import retime_finalists
from tuner.study.opening import Opened, Opening, Prelude, replay_history, sampler_study
from tuner.study.options import StudyOptions
from tuner.study.pool import Pool
from tuner.study.progress import Progress, Stats, study_location, time_split, worker_startup, writer_summary
from tuner.study.repair import Repair
from tuner.study.search import TPE_WIDE_UNTIL, make_sampler
from tuner.study.validset import IndexBuild, ValidSetSampler, valid_index

if TYPE_CHECKING:
    from optuna.samplers import BaseSampler


# ---------------------------------------------------------------------------------------------------------------
# the driver


def _values(result, objectives, family) -> list[float]:
    figures = result.to_dict()
    figures["throughput"] = result.tflops if family.throughput_unit == "TFLOP/s" else result.tbps
    figures["time_ms"] = result.median_ms
    return [float(figures[o.name]) for o in objectives]


@dataclass
class _Search:
    """The loop's state: what is measured, failed, in flight and waiting, and how far the study has come."""

    fast: Any  # the in-memory Optuna study the sampler works on
    pool: Pool
    mirror: Any
    stats: Stats
    target: int
    counted: int
    measured: dict[str, int]  # params key → the trial that measured it
    failed: dict[str, int]  # params key → the trial whose evaluation failed (never evaluated again)
    wide: bool  # TPE scores 128 candidates while several configs are in flight (`TPE_WIDE_UNTIL`)
    submitted: int = 0  # counted plus configs in flight
    grid_left: int | None = None  # grid: configs still queued; the study ends when they are spent
    index_pending: bool = False  # the repair's valid set not yet taken (`Driver._take_index`)
    index_wait_s: float = 0.0
    repair: Repair | None = None
    running: dict[str, int] = field(default_factory=dict)  # params key → trial number in flight
    trials: dict[int, Any] = field(default_factory=dict)  # trial number → the trial in flight
    waiting: defaultdict[str, list] = field(default_factory=lambda: defaultdict(list))  # duplicates of one in flight
    offered: set[str] = field(default_factory=set)  # keys other problems' studies queued here (`Driver.offer`)
    drawn: bool = False  # a proposal has been drawn in this run
    first_result_at: float | None = None
    progress: Progress = field(init=False)


class Driver:
    """Runs one study to N counted trials. Construct, then `run()`; `summary` holds the outcome."""

    def __init__(
        self,
        opts: StudyOptions,
        prelude: Prelude | None = None,
        space: space_mod.SearchSpace | None = None,
        ahead: Ahead | None = None,
    ):
        """A study of `opts`, of `space` where the caller loaded it already (`opts.space` is then its path, kept
        as the study's record; the file is not read again), else of the space `opts.space` names; it takes the
        writer and GPU workers its command started `ahead` (none given: it starts its own)."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        self.t0 = time.perf_counter()
        self.t_imports = since_command()
        self.opts = opts
        self.prelude = prelude or Prelude()
        self.ahead = ahead or Ahead()
        self.search: _Search | None = None  # the loop's state, while it runs
        self.summary: dict[str, Any] = {}
        # `opts` checked themselves as they were made (`StudyOptions._check`: the study's name among them). The
        # storage before anything else: a study that could not record its trials is refused before any work.
        self.url = study_storage_url(opts.storage, opts.kernel)
        # Checked (and probed with a write, rolled back) now, created only in run() once the pool is up: a refused
        # command leaves no database behind.
        storage_file = check_storage(self.url, opts.storage is not None) if self.url != ":memory:" else None
        if space is None:
            if opts.space == opts.kernel and opts.kernel not in kernels.names():
                raise InputError(f"unknown kernel {opts.kernel!r} (known: {', '.join(kernels.names())})")
            space = space_mod.load(opts.space)
        self.space = space
        if self.space.kernel != opts.kernel:
            raise InputError(f"space is for kernel {self.space.kernel!r}, not {opts.kernel!r}", str(self.space.path))
        self.problem = self.space.problem(opts.problem)
        self.family = self.space.family
        self.engine = Engine.of(opts, self.ahead)
        self.engine.check_kernel(self.space, self.problem)  # before anything is written
        self.objectives = self.space.objectives[:1] if opts.objectives == "first" else self.space.objectives
        self.space = self.engine.searched(self.space, self.problem)
        self.codec = Codec(self.space.params, ordered=opts.ordered)
        self.sampler_s = 0.0
        # made now so a missing extra is refused before the pool starts; remade in run() for the pool's capacity
        self.sampler = self._make_sampler(1)
        self.memory: Any = None  # the sampler's study's storage and the study's id there, made by run()
        self.fast_id = 0
        self.worst: list[float] | None = None  # the worst values measured so far (`tuner.study.failures`)
        #: what opens the study, and owns what it opens (its storage, its lease, the pool until the loop has it)
        self.opening = Opening(
            opts,
            self.url,
            storage_file,
            self.space,
            self.problem,
            self.objectives,
            self.prelude,
            self.engine,
            self.ahead,
            self.t0,
        )
        #: (name, counted trials) of a study that holds its trials already: run() then starts nothing
        self.complete = self.opening.complete_before_start()
        if self.complete is None:  # a complete study needs no GPU: it is said to be complete on any machine
            self.engine.check_gpus()

    def _make_sampler(self, in_flight: int) -> BaseSampler | ValidSetSampler:
        sampler = make_sampler(self.opts.sampler, self.opts.seed, len(self.objectives), in_flight)
        if self.opts.inside_valid_set and self.opts.sampler != "grid":
            return ValidSetSampler(sampler, self.codec)
        return sampler

    def _narrow_sampler(self, fast) -> None:
        """From here on, TPE scores its usual 24 candidates per proposal (see TPE_WIDE_UNTIL)."""
        narrow = make_sampler(self.opts.sampler, self.opts.seed, len(self.objectives), 1)
        if isinstance(self.sampler, ValidSetSampler):
            self.sampler.base = narrow  # the wrapper keeps its valid set and what it knows is explored
        else:
            self.sampler = fast.sampler = narrow

    # -- the loop -----------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run the study; the study's lease (see tuner.store.lease) is held from before the first read of its trials
        to the end."""
        for _ in self.steps():
            pass
        return self.summary

    def steps(self) -> Iterator[None]:
        """`run`, one turn of the ask → evaluate → tell loop at a time: a generator that yields after each turn
        and sets `summary` as it ends, so one thread can step several studies side by side over one pool
        (`tuner.study.sidebyside`)."""
        if self.complete is not None:
            self.summary = self.opening.already_complete(*self.complete)  # no pool, no writer, no lease
            return
        try:
            self.summary = yield from self._run()
        except BaseException as exc:
            with quiet_after_interrupt(isinstance(exc, KeyboardInterrupt)):
                self.opening.stop_set_up()  # refused or interrupted during set-up: stop what was started for it
            raise
        finally:
            self.opening.release()

    def offer(self, params: dict[str, Any], source: str) -> bool:
        """Measure `params` next (the best config of problem `source`'s study, `tuner.study.sidebyside`; its trial
        says so in `TrialAttr.TAKEN_FROM`): True when it is queued, False when this study is not searching, has
        its target in flight, or knows the config already, or the config is not valid here."""
        s = self.search
        if s is None or s.submitted >= s.target or s.grid_left is not None:
            return False
        key = params_key(params)
        if key in s.measured or key in s.failed or key in s.running or key in s.offered:
            return False
        if self.space.validate(params, self.problem) is not None:  # knobs this space lacks, too
            return False
        s.offered.add(key)
        s.fast.enqueue_trial(self.codec.encode(dict(params)), user_attrs={TrialAttr.TAKEN_FROM: source})
        return True

    def _run(self) -> Generator[None, None, dict[str, Any]]:
        # The valid set (for the repair of unmeasurable proposals) is listed, or read from the cache, beside the
        # set-up: with this process's problem (the default GPU facts), checked against the workers' facts below.
        index_build = IndexBuild(self.space, self.problem) if self.opts.sampler != "grid" else None
        pool, mirror = self.opening.start_pool()
        opened = self.opening.open(pool, mirror)
        self.problem = opened.problem  # with the GPU facts the workers reported
        fast, wide = self._sampler_study(pool, opened.stamps)
        measured, failed, counted, self.worst = replay_history(fast, opened, self.codec, self.objectives, self.opts)
        if counted >= self.opts.trials:  # complete already (its name waited for the GPU): nothing to ask or write
            self.opening.stop_set_up()
            return self.opening.already_complete(opened.name, counted)
        yield  # the pool and the study are open: side by side, the other studies open theirs now
        stats = Stats(self.family.throughput_unit, opened.past, gpu=self.problem.gpu, objectives=self.objectives)
        s = _Search(fast, pool, mirror, stats, self.opts.trials, counted, measured, failed, wide, submitted=counted)
        self._enqueue(s, opened)
        # A new study's first config is the space default, enqueued above: it needs no repair, so it goes out
        # before the wait for the valid set, whose listing (seconds on a fresh machine) then overlaps its
        # measurement. The sampler's proposals are the same either way.
        if s.index_pending and (opened.past or index_build is None or index_build.done()):
            self._take_index(s, index_build)
        if s.mirror is None:  # an in-process study: no writer, and a study it opened itself
            assert opened.study_id is not None
            s.mirror = InlineMirror(self.opening.opened_storage(), opened.study_id)
        self.opening.handed_over()
        s.progress = Progress(
            self.opts.progress,
            s.target,
            counted,
            stats,
            where=study_location(opened.name, self.url),
            label=self.prelude.label,
            bar=self.prelude.bar,
        )
        self.search = s
        self._set_cutoff(pool, stats)  # a resumed study screens against its best so far from the start
        # "After start-up" counts from here: the pool is up and the study open, the first config goes out now.
        ran: dict[str, Any] = {"loop_started": time.perf_counter()}
        interrupted = False
        try:
            with s.progress:
                yield from self._loop(s, index_build)
            ran["loop_end"] = time.perf_counter()
            ran["spent"] = pool.spent()  # before the finalists: their work falls after loop_end
            finalists = retime_finalists(self, fast, pool, opened.set_study_attr) if pool.measures else []
            ran["finalists_s"] = time.perf_counter() - ran["loop_end"]
            ran["gpus"], ran["measures"] = pool.gpus, pool.measures
            ran["compile_threads"] = pool.report().compile_slots
            ran["startup"] = self._startup_figures(s, opened, ran["loop_started"])
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            try:
                with quiet_after_interrupt(interrupted):
                    pool.close()
            except KeyboardInterrupt:
                interrupted = True
                raise
            finally:  # the trials told so far are written, whatever happened above
                ran["flush_started"] = time.perf_counter()
                with quiet_after_interrupt(interrupted):
                    writer = close_writer(s.mirror)
        summary = self._summary(s, opened, ran, finalists, writer)
        if self.prelude.table:
            s.progress.final(summary)
        return summary

    def _sampler_study(self, pool: Pool, stamps: dict[str, Any]):
        """The in-memory study the sampler works on, and whether TPE starts wide (several configs in flight)."""
        wide = pool.capacity > 1 and self.opts.sampler == "tpe"
        if wide:  # the sampler suited to several configs in flight (make_sampler)
            self.sampler = self._make_sampler(pool.capacity)
        fast, self.memory, self.fast_id = sampler_study(self.sampler, self.objectives)
        stamps["sampler_study_made_s"] = since_command()
        return fast, wide

    # -- the loop -----------------------------------------------------------------------------------------------
    def _enqueue(self, s: _Search, opened: Opened) -> None:
        """Queue what the sampler does not choose: the configs a killed driver left unmeasured, the space's
        default for a new search, and for a grid every valid config not yet evaluated (the target then is what
        the grid holds)."""
        fast = s.fast
        queued: set[str] = set()  # keys enqueued below: each config once
        for params in opened.again:
            key = params_key(params)
            # A config interrupted in one trial may be measured in another (a duplicate): it is not run again.
            if key not in s.measured and key not in s.failed and key not in queued:
                queued.add(key)
                fast.enqueue_trial(self.codec.encode(params))
        if not opened.past and self.opts.sampler != "grid":
            # A new study measures the space's default (a known-good config) first: a baseline the search
            # must beat, and a floor under what it reports. One given configs to start from (`Prelude.first`:
            # the best of other problems' studies) measures those instead: they are the better floor.
            for params in self.prelude.first or [dict(self.space.default)]:
                key = params_key(params)
                if key not in queued:
                    queued.add(key)
                    fast.enqueue_trial(self.codec.encode(dict(params)))
        s.index_pending = self.opts.sampler != "grid"
        if self.opts.sampler == "grid":
            from optuna.trial import TrialState

            # Every valid config not yet evaluated, once (the interrupted ones are queued above already).
            done_keys = {params_key(t.params) for t in opened.past if counts(t)}
            for params in self.space.valid_configs(self.problem):
                key = params_key(params)
                if key not in done_keys and key not in queued:
                    queued.add(key)
                    fast.enqueue_trial(self.codec.encode(params))
            s.grid_left = sum(1 for t in fast.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
            s.target = min(s.target, s.counted + s.grid_left)
            opened.stamps["grid_queued_s"] = since_command()

    def _take_index(self, s: _Search, index_build: IndexBuild | None) -> None:
        """Wait for the valid set (listed in the background, or read from the cache), then set up the repair and
        cap the target at the configs left to evaluate."""
        s.index_pending = False
        t_index = time.perf_counter()
        assert index_build is not None
        index = index_build.result()
        if index_build.problem.expression_env != self.problem.expression_env:  # another GPU: list it for this one
            index = valid_index(self.space, self.problem)
        s.index_wait_s = time.perf_counter() - t_index
        # Random search draws its replacements uniformly too: the nearest config would skew it towards the edges
        # of the valid set.
        repair = s.repair = Repair(index, self.opts.seed, nearest=self.opts.repair and self.opts.sampler != "random")
        if repair.complete:
            # Proposals that cannot be measured do not count: the study ends when the valid set is spent.
            unexplored = repair.size() - sum(1 for k in set(s.measured) | set(s.failed) if repair.contains(k))
            s.target = min(s.target, s.counted + unexplored)
            if isinstance(self.sampler, ValidSetSampler):
                self.sampler.attach(repair, lambda: s.measured.keys() | s.failed.keys() | s.running.keys())

    def _loop(self, s: _Search, index_build: IndexBuild | None) -> Iterator[None]:
        """Ask → evaluate → tell until the study holds its target of counted trials, or a grid is spent; yields
        after each turn (`steps`)."""
        check_writer = s.mirror.check if isinstance(s.mirror, Mirror) else None
        while s.counted < s.target:
            if check_writer is not None:
                check_writer()  # a new study the writer could not create, or a writer that died
            if s.grid_left == 0 and s.pool.in_flight == 0:
                break  # every queued config is answered; a config that did not count is not re-drawn
            self._propose(s, index_build)
            self._collect(s)
            s.progress.update(s.counted)
            yield

    def _propose(self, s: _Search, index_build: IndexBuild | None) -> None:
        """Ask for configs until the pool is full or the target is in flight. A proposal that cannot be measured
        is answered at once, and the nearest unexplored valid config is measured in its place."""
        pool, fast = s.pool, s.fast
        while s.submitted < s.target and pool.in_flight < pool.capacity and s.grid_left != 0:
            if s.index_pending and s.drawn:
                self._take_index(s, index_build)  # the default is out; later proposals may need the repair
                s.progress.set_total(s.target)
                if s.submitted >= s.target:
                    break
            s.drawn = True
            if s.grid_left is not None:
                s.grid_left -= 1
            if s.wide and s.counted >= TPE_WIDE_UNTIL:
                s.wide = False
                self._narrow_sampler(fast)
            started = time.perf_counter()
            trial = fast.ask(self.codec.sampler_dists)
            self.sampler_s += time.perf_counter() - started
            params = self.codec.decode(trial.params)
            if self._submit(s, trial, params):
                continue
            # The proposal cannot be measured: measure the nearest unexplored valid config next.
            if s.index_pending:
                self._take_index(s, index_build)
                s.progress.set_total(s.target)
            explored = set(s.measured) | set(s.failed) | set(s.running)
            nearest = s.repair.nearest(params, explored) if s.repair is not None else None
            if nearest is None:
                break  # nothing unexplored is free now: wait for a result
            fast.enqueue_trial(self.codec.encode(nearest))

    def _submit(self, s: _Search, trial, params: dict[str, Any]) -> bool:
        """Send the proposal `trial` to the pool (True), or answer it without evaluation (False): an invalid
        config, one measured or failed already, or one in flight (answered when that result comes)."""
        key = params_key(params)
        s.mirror.start(trial.number, self.codec.record(self._frozen(trial.number)))
        reason = self.space.validate(params, self.problem)
        if reason is not None:
            self._screen(trial, "invalid", s.stats)
            self._tell(s.fast, s.mirror, trial, Invalid(reason=reason), s.stats)
        elif key in s.measured:
            self._screen(trial, "duplicate", s.stats)
            self._tell_duplicate(s.fast, s.mirror, trial, s.measured[key], s.stats)
        elif key in s.failed:
            self._screen(trial, "known_failure", s.stats)
            self._tell_duplicate(s.fast, s.mirror, trial, s.failed[key], s.stats)
        elif key in s.running:
            self._screen(trial, "duplicate", s.stats)
            s.waiting[key].append(trial)
        else:
            s.running[key] = trial.number
            s.trials[trial.number] = trial
            s.pool.submit(trial.number, params, budget_ms=self.opts.screen_budget_ms)
            s.submitted += 1
            return True
        return False

    def _collect(self, s: _Search) -> None:
        """Tell the sampler, and the writer, every result the pool has; answer the duplicates that waited."""
        pool = s.pool
        for number, result in pool.poll():
            s.first_result_at = s.first_result_at or time.perf_counter()
            trial = s.trials.pop(number)
            if number in pool.ran_on:
                trial.set_user_attr(TrialAttr.WORKER_GPU_INDEX, pool.ran_on.pop(number))
            if number in pool.ran_by:
                trial.set_user_attr(TrialAttr.WORKER, pool.ran_by.pop(number))
            built = pool.built.pop(number, None)
            if result.ok and built is not None and self.opening.artifacts is not None:
                self.opening.artifacts.attach(trial, *built)
            key = params_key(self.codec.decode(trial.params))
            s.running.pop(key, None)
            s.counted += self._tell(s.fast, s.mirror, trial, result, s.stats)
            if not result.ok and result.details.get("phase") == "reference":
                # The reference is every config's: its fault fails them all, so the study stops here.
                raise InputError(result.reason, str(self.space.path))
            (s.measured if result.ok else s.failed)[key] = trial.number
            self._set_cutoff(pool, s.stats)
            for dup in s.waiting.pop(key, []):
                self._tell_duplicate(s.fast, s.mirror, dup, trial.number, s.stats)

    # -- finishing ----------------------------------------------------------------------------------------------
    def _startup_figures(self, s: _Search, opened: Opened, loop_started: float) -> dict[str, Any]:
        """Where the time before the first config went: imports, storage, the valid set, the set-up's stamps,
        the pool's and the first GPU worker's start-up, and the first result."""
        since = self.t_imports - self.t0  # a perf_counter stamp → seconds from the command's start
        return {
            "imports_s": round(self.t_imports, 3),
            "storage_s": round(opened.storage_s, 3),
            # the set-up's wait for the valid set (listed beside the set-up, or read from the cache)
            "valid_index_wait_s": round(s.index_wait_s, 3),
            **opened.stamps,
            **s.pool.report().startup,
            **worker_startup(s.pool.gpus),
            "study_ready_s": round(loop_started + since, 3),
            "first_result_s": round(s.first_result_at + since, 3) if s.first_result_at else None,
        }

    def _summary(self, s: _Search, opened: Opened, ran: dict[str, Any], finalists, writer) -> dict[str, Any]:
        """What the run did and where its time went (`run`'s result; ``tuner study --json`` prints it)."""
        stats, loop_started, loop_end = s.stats, ran["loop_started"], ran["loop_end"]
        wall = loop_end - self.t0
        after_start = loop_end - loop_started
        # The GPUs may have measured before the loop started (configs prefetched while the study opened).
        report = s.pool.report()
        busy_window = loop_end - min(loop_started, report.busy_since or loop_started)
        evaluated = stats.measured + sum(n for kind, n in stats.failures.items() if kind != "invalid")
        asked = len(s.fast.get_trials(deepcopy=False)) - len(opened.past)
        gpus = ran["gpus"]
        summary = {
            "study": opened.name,
            "storage": self.url,
            "trials": s.counted,
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
            "cold_start_s": ran["startup"]["first_result_s"],
            "gpus": gpus,
            "startup": ran["startup"],
            **time_split(ran["spent"], wall, busy_window, len(gpus), ran["compile_threads"], ran["measures"]),
            "after_start_s": round(after_start, 3),
            "evaluated_per_s": round(evaluated / after_start, 3) if after_start > 0 else None,
            "finalists_s": round(ran["finalists_s"], 3),
            "writer_flush_s": round(time.perf_counter() - ran["flush_started"], 3),
            # What a user waits for, up to this summary: from the command's start (imports included) through the
            # search, the finalists' re-timing and the writer's last commit. `wall_s` is the driver's loop alone.
            "command_wall_s": since_command(),
            **({"writer": writer_summary(writer)} if writer else {}),
            "best": stats.best,
            "finalists": finalists,
            # Configs that hung: what each cost its GPU and its deadline; the start-up of each worker replaced.
            "hangs": list(report.hangs),
            "replacements_s": list(report.replacements_s),
        }
        if finalists and "tbps" in finalists[0]:
            summary["best"] = {**finalists[0], "screening": stats.best}
        return summary

    def _set_cutoff(self, pool: Pool, stats: Stats) -> None:
        """Screen later configs against the best median so far (`StudyOptions.screen_cutoff`)."""
        if self.opts.screen_cutoff and pool.measures and stats.best is not None:
            pool.cutoff_ms = self.opts.screen_cutoff * stats.best["median_ms"]

    # -- telling ------------------------------------------------------------------------------------------------
    def _frozen(self, number: int):
        """The fast study's trial `number` as it stands (a running one: params and start time)."""
        return self.memory.get_trial(self.memory.get_trial_id_from_study_id_trial_number(self.fast_id, number))

    def _screen(self, trial, why: str, stats: Stats) -> None:
        trial.set_user_attr(SCREENED, why)
        stats.screened[why] += 1

    def _tell_sampler(self, fast, trial, values=None, state=None):
        started = time.perf_counter()
        frozen = fast.tell(trial, values, state=state)
        self.sampler_s += time.perf_counter() - started
        return frozen

    def _tell(self, fast, mirror, trial, result: Result, stats: Stats) -> int:
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
            # sampler learns from it (see tuner.study.failures); the record keeps PRUNED/FAIL.
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

        if self.worst is not None and tells_failures_as_worst(self.opts.sampler, self.opts.inside_valid_set, kind):
            return self._tell_sampler(fast, trial, list(self.worst))
        # nothing measured yet, or a failure this sampler does not model: the sampler skips the trial
        return self._tell_sampler(fast, trial, state=TrialState.PRUNED if kind == Invalid.kind else TrialState.FAIL)

    def _tell_duplicate(self, fast, mirror, trial, original: int, stats: Stats) -> int:
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


def run_study(
    opts: StudyOptions,
    prelude: Prelude | None = None,
    space: space_mod.SearchSpace | None = None,
    ahead: Ahead | None = None,
) -> dict[str, Any]:
    """Run the study of `opts` (of `space`, where loaded already, with what was started `ahead` of it: see
    `Driver`) to its end; its summary."""
    return Driver(opts, prelude, space, ahead).run()

"""Studies over several problems of one space in one command: ``tuner study KERNEL --problems all``.

An LLM runs a kernel at many shapes. `run_problems` runs one study per problem of the space in one database and
over one set of GPU workers and compile processes. By default the studies run side by side over one pool
(`tuner.study.sidebyside`): each keeps its share of the configs in flight, so its sampler learns from most of its
results before it proposes again, while the pool stays as full as for one study. With ``--one-at-a-time`` (and on
Ray, or for replays with a delay) they run one after another, each over the whole pool (`tuner.study.sharing`: a
study after the first starts with its GPUs up). Each is the study ``tuner study KERNEL --problem P`` would run,
under its default name, so the command resumes as a whole (a finished problem's study is said to be complete and
costs nothing) and every other command (``best``, ``export``, the dashboard) reads each study as usual.

Transfer between shapes: a new problem's study first measures the best configs of the studies of the same space
already tuned — in its database, and in ``--warm-start``'s (the same space tuned on another GPU, say) — the
problems nearest in log space of their sizes first (`first_configs`). They are its first trials, so they are
also what the sampler starts from: TPE models from them at once (its start-up draws are as many as they are),
instead of from random draws. A problem with nothing to learn from starts from the space's default as usual.
Side by side, a study also measures the new best configs of its nearest problems' studies as they find them
(`tuner.study.sidebyside.run_side_by_side`); one after another, each study starts from those tuned before it.

Replays: `match_replays` pairs each recording (``--replay`` given once per problem) with its problem by the
problem each recording's study was made for.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.core.errors import InputError
from tuner.gpu.clock import since_command
from tuner.space import space as space_mod
from tuner.space.space import params_key
from tuner.store.dbfiles import study_storage_url
from tuner.study.ahead import Ahead
from tuner.study.options import StudyOptions

__all__ = [
    "FIRST_LIMIT",
    "Source",
    "first_configs",
    "match_replays",
    "neighbours",
    "problem_distance",
    "problem_list",
    "run_problems",
    "warm_prelude",
]

#: the best config of a study that was complete before this run, from its summary (`run_problems`)
StoredBest = Callable[[dict[str, Any]], dict[str, Any]]

#: the most configs a new problem's study measures first from other problems' studies: as many as TPE's start-up
#: draws (`tuner.study.search.TPE_STARTUP`), which they replace, so TPE models from them at once
FIRST_LIMIT = 5
#: configs taken from the nearest problem's study (the rest: the best of each next nearest)
FROM_NEAREST = 3
#: side by side, a study measures the new best configs of the studies of its this many nearest problems
NEIGHBOURS = 2


@dataclass
class Source:
    """A study to learn from: its problem's sizes and its measured configs, best first."""

    study: str
    problem: str
    sizes: dict[str, Any]
    configs: list[dict[str, Any]] = field(default_factory=list)


def problem_list(space: space_mod.SearchSpace, problems: str | Sequence[str]) -> list[space_mod.Problem]:
    """The problems named by `problems`: "all" (every problem of the space, in its order), a comma-separated
    string, or a list of names. InputError, listing the space's problems, for a name it does not have."""
    names = [p.name for p in space.problems]
    if isinstance(problems, str):
        wanted = names if problems.strip() == "all" else [n.strip() for n in problems.split(",")]
    else:
        wanted = [str(n) for n in problems]
    if not wanted or any(not n for n in wanted):
        raise InputError(f"--problems {problems!r}: name problems, or all (the space's: {', '.join(names)})")
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise InputError(
            f"--problems: the space has no problem {', '.join(map(repr, unknown))} (its problems: {', '.join(names)})",
            str(space.path),
        )
    return [space.problem(n) for n in dict.fromkeys(wanted)]


def match_replays(problems: Sequence[space_mod.Problem], replays: Sequence[str]) -> dict[str, str]:
    """Problem name → the recording that answers its study: each recording goes to the problem its study was
    made for (by name, else by sizes); one recording of no known problem may answer a single problem. InputError
    for a recording of no problem listed, two recordings of one problem, or a problem left without one."""
    from tuner.study.replay import load_recording

    matched: dict[str, str] = {}
    for path in replays:
        attrs = load_recording(str(path))[1]
        recorded = attrs.get("problem") if isinstance(attrs.get("problem"), dict) else None
        if recorded is None:
            if len(problems) == 1 and len(replays) == 1:
                return {problems[0].name: str(path)}
            raise InputError("--replay: the recording does not say which problem it holds; give one per problem", path)
        hits = [p for p in problems if p.name == recorded.get("name")] or [
            p for p in problems if dict(p.sizes) == dict(recorded.get("sizes") or {})
        ]
        if not hits:
            listed = ", ".join(p.name for p in problems)
            raise InputError(f"--replay: a recording of problem {recorded.get('name')!r}, not of {listed}", path)
        if hits[0].name in matched:
            raise InputError(f"--replay: two recordings of problem {hits[0].name}: {matched[hits[0].name]}", path)
        matched[hits[0].name] = str(path)
    missing = [p.name for p in problems if p.name not in matched]
    if missing:
        raise InputError(f"--replay: no recording of problem {', '.join(missing)} (give --replay once per problem)")
    return matched


# ---------------------------------------------------------------------------------------------------------------
# what other studies know


def problem_distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How far two problems' sizes are apart in log space: the sum over their common numeric sizes of |log a/b|,
    the measure an exported header's `select` uses (the log of its product of max/min ratios)."""
    common = [k for k in a if k in b and isinstance(a[k], int | float) and isinstance(b[k], int | float)]
    return sum(abs(math.log(max(a[k], 1)) - math.log(max(b[k], 1))) for k in common)


def _source(study) -> Source | None:
    """What `study` (an optuna.Study) offers: its measured configs, best first (by its objective); None for one
    with none measured."""
    from tuner.store import schema

    try:
        measured = schema.measured_trials(study)
    except InputError:
        return None
    goal = schema.goal(study)
    ranked = sorted(measured, key=lambda t: (goal.rank(schema.objective_value(study, t, goal)), t.number))
    problem = study.user_attrs.get("problem") or {}
    return Source(
        study=study.study_name,
        problem=str(problem.get("name") or ""),
        sizes=dict(problem.get("sizes") or {}),
        configs=[dict(t.params) for t in ranked],
    )


def neighbours(problems: Sequence[space_mod.Problem], count: int = NEIGHBOURS) -> dict[str, list[str]]:
    """Problem name → the names of its `count` nearest other problems (`problem_distance`; ties in the given
    order): the studies whose new best configs its study measures, side by side."""
    out = {}
    for p in problems:
        others = [q for q in problems if q.name != p.name]
        others.sort(key=lambda q: problem_distance(dict(p.sizes), dict(q.sizes)))
        out[p.name] = [q.name for q in others[:count]]
    return out


def stored_sources(url: str, space: space_mod.SearchSpace) -> list[Source]:
    """The studies in the storage at `url` made with this space file (its content hash), as Sources; none where
    the storage does not exist yet."""
    import optuna

    from tuner.store.dbfiles import plain_sqlite_file
    from tuner.store.reading import get_storage

    path = plain_sqlite_file(url)
    if url == ":memory:" or (path is not None and not path.exists()):
        return []
    storage = get_storage(url)
    found = []
    # the studies' attributes alone (Optuna's study summaries would read every trial of every study)
    for frozen in storage.get_all_studies():
        if frozen.user_attrs.get("space_hash") != space.content_hash():
            continue
        source = _source(optuna.load_study(study_name=frozen.study_name, storage=storage))
        if source is not None:
            found.append(source)
    return found


def warm_sources(spec: str, space: space_mod.SearchSpace) -> list[Source]:
    """The studies ``--warm-start SPEC`` names (a study, a kernel or a .db file, as ``tuner best`` finds them), as
    Sources. InputError for a study of another space: one whose knobs, or their values, this space lacks."""
    from tuner.store.reading import open_studies

    found = []
    for study in open_studies(spec):
        source = _source(study)
        if source is None:
            continue
        differ = _knobs_differ(space, source.configs)
        if differ:
            raise InputError(f"--warm-start {spec}: study {study.study_name} is of another space: {differ}")
        found.append(source)
    if not found:
        raise InputError(f"--warm-start {spec}: no study there has a measured config")
    return found


def _knobs_differ(space: space_mod.SearchSpace, configs: list[dict[str, Any]]) -> str:
    """What keeps `configs` (another study's) out of this space, in words; "" when nothing does."""
    names = set().union(*(c.keys() for c in configs)) if configs else set()
    faults = []
    there = sorted(names - set(space.params))
    here = [n for n in space.params if n not in names]
    if there:
        faults.append(f"knobs only there: {', '.join(there)}")
    if here:
        faults.append(f"knobs only here: {', '.join(here)}")
    for name in sorted(names & set(space.params)):
        foreign = sorted({c[name] for c in configs if name in c} - set(space.params[name]), key=str)
        if foreign:
            faults.append(f"{name} takes {', '.join(map(str, foreign[:4]))} there, which this space does not")
    return "; ".join(faults)


def first_configs(
    space: space_mod.SearchSpace, problem: space_mod.Problem, sources: Sequence[Source], limit: int = FIRST_LIMIT
) -> list[dict[str, Any]]:
    """The configs a new study of `problem` measures first: from the nearest source (in log space of the sizes;
    the same problem on another GPU is nearest of all) its best `FROM_NEAREST`, then the best of each next
    nearest, up to `limit`; each valid for `problem` and once."""
    ranked = sorted(sources, key=lambda s: (problem_distance(dict(problem.sizes), s.sizes), s.problem != problem.name))
    chosen: list[dict[str, Any]] = []
    seen: set[str] = set()
    for rank, source in enumerate(ranked):
        taken = 0
        for params in source.configs:
            if len(chosen) >= limit or taken >= (FROM_NEAREST if rank == 0 else 1):
                break
            key = params_key(params)
            # validate refuses a config with a knob this space lacks or one it misses, too
            if key in seen or space.validate(params, problem) is not None:
                continue
            seen.add(key)
            chosen.append(dict(params))
            taken += 1
    return chosen


# ---------------------------------------------------------------------------------------------------------------
# the run


def warm_prelude(opts: StudyOptions, space: space_mod.SearchSpace | None = None):
    """The `tuner.study.opening.Prelude` of a one-problem study started from ``--warm-start``'s studies; `space`
    is the study's, where loaded already (else `opts.space` is read)."""
    from tuner.study.opening import Prelude

    assert opts.warm_start is not None
    space = space or space_mod.load(opts.space)
    sources = warm_sources(opts.warm_start, space)
    return Prelude(first=first_configs(space, space.problem(opts.problem), sources))


def run_problems(
    opts: StudyOptions,
    stored_best: StoredBest | None = None,
    space: space_mod.SearchSpace | None = None,
    ahead: Ahead | None = None,
) -> dict[str, Any]:
    """Run (or resume) one study per problem of `opts.problems` (see `problem_list`) to `opts.trials` trials each,
    with transfer between them (module docstring), also from `opts.warm_start`'s studies; `opts.replay` (a list)
    answers from recordings, one per problem (`match_replays`). Side by side over one pool
    (`tuner.study.sidebyside`) on the local engine and for replays; one after another with `opts.one_at_a_time`,
    on Ray, and for replays with a delay. Returns {"problems": a row per problem (name, sizes, study, trials,
    best, fraction of the ceiling, wall, configs transferred), "studies": each problem's study summary, "wall_s",
    "command_wall_s", "side_by_side"}. A study complete before this run measured nothing now: its row's best is
    `stored_best` of its summary (the API gives ``tuner best --json``'s view of the stored study), {} without one.
    `space` is the studies' space where loaded already (else `opts.space` is read): every study takes it as it is.
    `ahead` holds what the command started before (`tuner.study.ahead`); each study takes from it, and one
    started for the next study (`Prelude.spare_writer`) goes there too."""
    assert opts.problems is not None  # neither --study-name nor --problem beside it (`StudyOptions._check`)
    space = space or space_mod.load(opts.space)
    ahead = ahead or Ahead()
    chosen = problem_list(space, opts.problems)
    replays = [opts.replay] if isinstance(opts.replay, str) else list(opts.replay or [])
    recordings = match_replays(chosen, replays) if replays else {}
    url = study_storage_url(opts.storage, opts.kernel)
    warm = warm_sources(opts.warm_start, space) if opts.warm_start else []
    # The database's studies of this space, read once; each study run here is added as it ends.
    stored = {source.study: source for source in stored_sources(url, space)}
    together = _side_by_side(opts, chosen)
    t0 = time.perf_counter()
    run = _together if together else _in_turn
    rows, summaries = run(opts, space, chosen, recordings, url, stored, warm, ahead)
    if stored_best is not None:
        for row in rows:
            if row["complete_before_run"] and not row["best"]:
                row["best"] = stored_best(summaries[row["problem"]])
                row["fraction_of_ceiling"] = row["best"].get("fraction_of_ceiling")
    out = {
        "problems": rows,
        "studies": summaries,
        "wall_s": round(time.perf_counter() - t0, 3),
        "command_wall_s": since_command(),
        "side_by_side": together,
    }
    if opts.progress:
        from tuner.study.progress import problems_table

        problems_table(out, space.family.throughput_unit, space.kernel)
    return out


def _side_by_side(opts: StudyOptions, chosen: Sequence[space_mod.Problem]) -> bool:
    """Whether the problems' studies run side by side: more than one problem, not `one_at_a_time`, and a pool
    that can serve several problems (the local engine, or replays answered without delay)."""
    if opts.one_at_a_time or len(chosen) < 2 or opts.ray_address or opts.engine == "ray":
        return False
    return not (opts.replay and opts.replay_delay_s)


def _prelude(space, problem, stored: dict[str, Source], warm: list[Source], label: str, **more):
    """The `tuner.study.opening.Prelude` of `problem`'s study: it starts from the best configs of every study of
    this space in the database but its own (on any GPU) and of `warm`'s (`first_configs`); the runner prints the
    table."""
    from tuner.study.opening import Prelude

    sources = [s for s in stored.values() if s.problem != problem.name] + warm
    return Prelude(first=first_configs(space, problem, sources), label=label, table=False, **more)


def _one(opts: StudyOptions, problem: space_mod.Problem, recordings: dict[str, str]) -> StudyOptions:
    """The options of `problem`'s own study."""
    return dataclasses.replace(
        opts,
        problem=problem.name,
        problems=None,
        one_at_a_time=False,
        warm_start=None,
        replay=recordings.get(problem.name),
    )


def _in_turn(opts, space, chosen, recordings, url, stored, warm, ahead):
    """The studies one after another, each over the whole pool (`tuner.study.sharing` keeps its workers up)."""
    from tuner.study.driver import run_study
    from tuner.study.sharing import shared_workers

    rows, summaries = [], {}
    with shared_workers() as kept:
        ahead.kept = kept  # each study's pool keeps its workers there for the next, and takes the last one's
        try:
            for i, problem in enumerate(chosen):
                started = time.perf_counter()
                label = f"{problem.name} ({i + 1}/{len(chosen)})"
                prelude = _prelude(space, problem, stored, warm, label, spare_writer=i + 1 < len(chosen))
                summary = run_study(_one(opts, problem, recordings), prelude, space, ahead)
                summaries[problem.name] = summary
                source = _source(_load(summary)) if url != ":memory:" else None
                if source is not None:
                    stored[source.study] = source
                rows.append(_row(problem, summary, time.perf_counter() - started, len(prelude.first)))
        finally:
            ahead.kept = None
    return rows, summaries


def _together(opts, space, chosen, recordings, url, stored, warm, ahead):
    """The studies side by side over one pool (`tuner.study.sidebyside`): each starts from what the database and
    `warm` hold, and takes the new best configs of its neighbours' studies as they are found."""
    from tuner.store.dbfiles import open_storage
    from tuner.study.driver import Driver
    from tuner.study.progress import progress_display
    from tuner.study.sidebyside import LocalBackend, run_side_by_side

    bar = progress_display(opts.progress)
    drivers = {}
    for problem in chosen:
        # the pool is made below, once every study's options are checked: the share is taken as the study opens
        prelude = _prelude(space, problem, stored, warm, problem.name, bar=bar)
        drivers[problem.name] = Driver(_one(opts, problem, recordings), prelude, space, ahead)
    if url != ":memory:":
        open_storage(url)  # made here, once: each study's writer would otherwise race to create the same file
    searching = sum(1 for d in drivers.values() if d.complete is None)  # a complete study takes no share
    if recordings:
        from tuner.study.local import LocalPool
        from tuner.study.sidebyside import ProblemReplays

        replays = ProblemReplays(chosen, recordings, opts.replay_study)
        # Answered at once, in the driver's thread and in order, as a one-problem replay is (reproducible).
        pool = LocalPool(space, chosen[0], lambda i: replays, gpus=opts.gpus or 1, inline=True)
        # in process: the width asked for; else this machine's pool's (its capacity, the LocalBackend default)
        width = opts.replay_in_flight if opts.in_process else None
        backend = LocalBackend(pool, searching, width, recordings)
    else:
        first_driver = next(iter(drivers.values()))
        pool = first_driver.engine.pool(first_driver.space, first_driver.problem, lambda: False)
        backend = LocalBackend(pool, searching)
    for driver in drivers.values():
        driver.prelude.pool = backend.share
    try:
        with bar:
            done = run_side_by_side(drivers, neighbours(chosen))
    finally:
        backend.close()
    rows, summaries = [], {}
    for problem in chosen:
        summary, wall_s, taken = done[problem.name]
        summaries[problem.name] = summary
        rows.append(_row(problem, summary, wall_s, len(drivers[problem.name].prelude.first), taken))
    return rows, summaries


def _row(
    problem: space_mod.Problem, summary: dict[str, Any], wall_s: float, transferred: int, taken: int = 0
) -> dict[str, Any]:
    best = summary.get("best") or {}
    return {
        "problem": problem.name,
        "sizes": dict(problem.sizes),
        "study": summary.get("study"),
        "trials": summary.get("trials"),
        "best": best,
        "fraction_of_ceiling": best.get("fraction_of_ceiling"),
        "wall_s": round(wall_s, 3),
        "first_from_other_problems": transferred,
        # side by side: the configs the neighbouring problems' studies queued here as they found them
        "taken_from_other_problems": taken,
        "complete_before_run": bool(summary.get("complete_before_run")),
    }


def _load(summary: dict[str, Any]):
    """The optuna.Study a study summary names."""
    import optuna

    from tuner.store.reading import get_storage

    return optuna.load_study(study_name=summary["study"], storage=get_storage(summary["storage"]))

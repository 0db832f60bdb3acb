"""What a study is asked to do: `StudyOptions`, declared once for both faces, and the defaults that follow from it
(storage, engine, study name).

A field made with `option(...)` is set from outside: its metadata says the flag of ``tuner study`` (help text,
choices or kind of value), the keyword of `tuner.study` (the field's name unless it says another) and the value
each takes. `tuner.cli.study` adds the flags from it, `tuner.api.study` takes and checks its keywords by it
(`check_call`, `from_keywords`), and its signature and docstring list them. A plain field (the finalists, the
replay's in-flight count, ...) is set by code alone. This module imports nothing heavy: the command line reads it
before the study's imports.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.space import limits
from tuner.study.values import INTEGER, POSITIVE, POSITIVE_INT, SECONDS, Kind, Number

if TYPE_CHECKING:
    from tuner.space import space as space_mod


SAMPLERS = limits.SAMPLERS


ENGINES = limits.ENGINES

#: ``--screen-cutoff``: a factor above 1, or off (none) for no cut-off. 0 is a factor like 0.5, refused like it: a
#: number that meant "off" only at exactly 0 would read as "cut everything" to anyone who tried 0.5 first
SCREEN_CUTOFF = Number(
    "a factor above 1 or off",
    lambda v: v > 1,
    "above 1 or off (at 1 or below even a new best would be cut)",
    "a factor above 1, or None",
    off=("off", "none"),
)

#: `option`'s "as the field says": the flag and the keyword from its name, the keyword's default its default
_FROM_FIELD: Any = object()


@dataclass(frozen=True)
class Option:
    """How one field of `StudyOptions` is set from outside: by its flag (None: none), by its keyword of
    `tuner.study` (None: none; `space` and `trials` are the call's positional arguments), or both."""

    field: str
    #: "--replay-delay"; a name without dashes is a positional argument ("kernel")
    flag: str | None
    keyword: str | None
    help: str | None
    metavar: str | None
    kind: Kind | None
    #: the names the flag and the keyword take → the field's value for each
    choices: Mapping[str, Any] | None
    #: a flag that turns a bool off: ``--categorical`` is ``ordered=False``
    negated: bool
    #: a flag that may be given more than once (``--replay`` once per problem): its values as a list
    many: bool
    required: bool
    #: what the flag and the keyword take when not given (the field's default, in their terms)
    default: Any
    #: the keyword's default where it is not `default`
    keyword_default: Any
    #: the keyword's annotation
    annotation: str
    #: the keyword's value → the field's, where the choices do not say it
    to_field: Callable[[Any], Any] | None

    @property
    def positional(self) -> bool:
        return self.flag is not None and not self.flag.startswith("-")

    @property
    def is_switch(self) -> bool:
        """A flag without a value (``--takeover``): the option is a bool without choices."""
        return self.annotation == "bool" and self.choices is None

    def check(self, value: Any) -> Any:
        """`value` as the keyword gives it, checked: an InputError of one line naming the keyword otherwise."""
        if value is None and self.keyword_default is None and not self.required:
            return None
        try:
            if self.choices is not None and not (isinstance(value, str) and value in self.choices):
                raise ValueError(f"choose {_alternatives(list(self.choices))}")
            return self.kind.check(value) if self.kind is not None else value
        except ValueError as exc:
            raise InputError(f"{self.keyword or self.field} {value!r}: {exc}") from None

    def field_value(self, value: Any) -> Any:
        """The field's value for the keyword's (checked) `value`."""
        if self.choices is not None and value is not None:
            return self.choices[value]
        if self.to_field is not None and value is not None:
            return self.to_field(value)
        return value


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str | None = None,
    flag: str | None = _FROM_FIELD,
    keyword: str | None = _FROM_FIELD,
    metavar: str | None = None,
    kind: Kind | None = None,
    choices: Sequence[str] | Mapping[str, Any] | None = None,
    negated: bool = False,
    many: bool = False,
    required: bool = False,
    keyword_default: Any = _FROM_FIELD,
    annotation: str | None = None,
    to_field: Callable[[Any], Any] | None = None,
) -> Any:
    """A field of `StudyOptions` that is set from outside (see `Option`). The flag is the field's name with dashes
    (``--study-name``) and the keyword the field's name, unless given; a bool without choices is a switch
    (``--takeover``); `choices` may map each name to the field's value (``--repair nearest`` is ``repair=True``)."""
    spec = dict(
        flag=flag,
        keyword=keyword,
        help=help,
        metavar=metavar,
        kind=kind,
        choices=dict(choices) if isinstance(choices, Mapping) else None if choices is None else {c: c for c in choices},
        negated=negated,
        many=many,
        required=required,
        keyword_default=keyword_default,
        annotation=annotation,
        to_field=to_field,
    )
    return dataclasses.field(default=default, metadata={"option": spec})


def _paths(value: Any) -> str | list[str]:
    """A recording's path as text, or each of several."""
    return str(value) if isinstance(value, str | os.PathLike) else [str(v) for v in value]


@dataclass
class StudyOptions:
    """What one study is asked to do. The fields made with `option` are the flags of ``tuner study`` and the
    keywords of `tuner.study`, in the order ``--help`` lists them; the plain fields after them are set by code."""

    kernel: str = option(
        flag="kernel",
        help="kernel family, e.g. gemm, or a space file (.yaml), whose kernel is then the family",
        keyword_default=None,  # the space's kernel
        annotation="str | None",
    )
    space: str = option(help="space file (default: the shipped space named after the kernel)", keyword=None)
    trials: int = option(kind=POSITIVE_INT, required=True, help="trials the study should end with", keyword=None)
    storage: str | None = option(
        None,
        help="a .db path or SQLAlchemy URL (default sqlite:///studies/KERNEL.db, relative to the current directory)",
    )
    study_name: str | None = option(None, help="default: KERNEL-PROBLEM-GPU, so the same command resumes")
    sampler: str = option("forest", choices=SAMPLERS, help="search (docs/search.md says when to use which)")
    seed: int | None = option(None, kind=INTEGER)
    gpus: int | None = option(
        None,
        kind=POSITIVE_INT,
        help="GPU workers (default: every GPU this machine has; under --engine ray, every GPU Ray sees)",
    )
    ray_address: str | None = option(None, help="join an existing Ray cluster (default: start one locally)")
    timeout: float = option(
        60.0,
        kind=POSITIVE.wanting("a positive number of seconds"),
        help="the most seconds a config may take before it is a hang (its deadline fits it: tuner.gpu.deadline)",
    )
    #: "local" (threads and GPU worker processes on this machine, no Ray) or "ray"; None: ray when
    #: `ray_address` is given, else local
    engine: str | None = option(
        None,
        choices=ENGINES,
        help="local: GPU worker processes and compile threads on this machine, no Ray (the default "
        "without --ray-address); ray: Ray actors and tasks (the default with --ray-address)",
    )
    #: a recording (a study database or a Kernel Tuner cache); with `problems`, a list of them, one per problem
    replay: str | list[str] | None = option(
        None,
        metavar="PATH",
        many=True,
        help="answer from a recorded study instead of a GPU (with --problems: once per problem)",
        annotation="str | Path | Sequence[str | Path] | None",
        to_field=_paths,
    )
    replay_delay_s: float = option(
        0.0,
        flag="--replay-delay",
        keyword="replay_delay",
        kind=SECONDS,
        metavar="S",
        help="seconds each replayed answer takes, standing in for GPU time",
    )
    #: take the study over from a driver that holds its lease (see tuner.store.lease)
    takeover: bool = option(
        False, help="take the study over from a driver that holds it (after that driver's host crashed)"
    )
    replay_study: str | None = option(None, metavar="NAME", help="the study to replay when the file holds several")
    #: answer replayed configs in this process (no Ray, no writer process): `replay_in_flight` configs in flight
    in_process: bool = option(False, help="with --replay: answer in this process (no Ray), one config in flight")
    #: after a proposal that cannot be measured (breaks a constraint, already measured or failed, in flight),
    #: measure the nearest unexplored valid config next (see `Repair`); False: a uniform draw among them
    repair: bool = option(
        True,
        choices={"nearest": True, "random": False},
        help="after a proposal that cannot be measured, measure the nearest unexplored valid config "
        "(default) or a uniform draw among them",
    )
    #: what the sampler optimises: "first" = the space's first objective alone (throughput; the Pareto front of
    #: registers and SMEM is computed from all measured trials afterwards), "all" = every objective of the space
    objectives: str = option(
        "first",
        choices=("first", "all"),
        help="search the space's first objective (throughput; default; the Pareto front of registers "
        "and SMEM comes from all measured trials) or all of them (multi-objective)",
    )
    #: numeric params as ordered (index) distributions for the sampler (see `tuner.study.codec.Codec`)
    ordered: bool = option(
        True,
        flag="--categorical",
        negated=True,
        help="show the sampler every param as categorical (default: numeric params are ordered)",
    )
    #: multi-fidelity screening: a config whose 3-repetition estimate is over this many times the best median
    #: so far is reported from those 3 repetitions and not timed further (`tuner.gpu.timing.benchmark`); its figure
    #: steers the search, and the finalists are re-timed in full anyway. None: every config gets the budget
    screen_cutoff: float | None = option(
        1.05,
        kind=SCREEN_CUTOFF,
        metavar="X",
        help="stop timing a config after its 3-repetition estimate when that is over X times the best median "
        "so far (default 1.05; off: every config gets the full budget)",
    )
    #: timed work per config while screening (at least 10 repetitions; `tuner.gpu.timing.benchmark`); the finalists
    #: get `final_budget_ms`. Measured on an H200 (benchmarks/results/screen_fidelity-*-5ms-*): 5 ms against 25
    #: ms of transpose, softmax and GEMV configs agreed within 1.1% per config (median 0.1-0.4%, as 10 ms did), and
    #: the config picked by the 5 ms figure was the fastest by the 25 ms one, or within 0.1% of it (four or five of
    #: the fastest five held their place) — the finalists' re-timing decides among them. A GEMM-sized kernel
    #: (~3 ms) is held by the 10 repetitions, not by the budget
    screen_budget_ms: float = option(
        5.0,
        flag="--screen-ms",
        keyword="screen_ms",
        kind=POSITIVE.wanting("a positive number of milliseconds"),
        metavar="MS",
        help="timed work per config while screening, at least 10 launches (default 5); finalists get more",
    )
    problem: str | None = option(None, help="the space's problem to tune (default: its first)")
    #: "all" or problem names: a study per problem, with transfer between them (`tuner.study.shapes`)
    problems: str | list[str] | None = option(
        None,
        metavar="all|P,Q,...",
        help="a study per problem of the space (all, or names), side by side over the same GPU workers, "
        "each measuring the best configs of the problems nearest it",
        annotation="str | Sequence[str] | None",
        to_field=lambda v: v if isinstance(v, str) else [str(n) for n in v],
    )
    #: with `problems`: the studies one after another, each over the whole pool, instead of side by side
    one_at_a_time: bool = option(
        False,
        help="with --problems: tune the problems one after another, each over the whole pool (default: side by side, "
        "each with a share of the configs in flight)",
    )
    #: a study, kernel or .db whose studies of the same space a new study starts from (`tuner.study.shapes`)
    warm_start: str | None = option(
        None,
        metavar="STUDY",
        help="start from the best configs of the studies of this space in STUDY (a study, kernel or .db: "
        "the same space tuned elsewhere, on another GPU say)",
        to_field=str,
    )
    #: draw the progress bar and the summary (a call of `tuner.study` draws none unless asked)
    progress: bool = option(
        True, flag="--json", negated=True, help="print the summary as JSON, no progress bar", keyword_default=False
    )

    # Set by code alone (tests, benchmarks): no flag, no keyword.
    #: once the valid set is listed (and small enough to list), the sampler proposes only valid configs not yet
    #: measured, failed or in flight (`tuner.study.validset.ValidSetSampler`); False: every proposal is screened and
    #: repaired by the driver instead
    inside_valid_set: bool = True
    replay_in_flight: int = 1
    #: search only the configs the replay recording holds (`tuner.study.replay.recorded_subspace`): for a recording
    #: that covers part of the space, where a config it lacks has no answer
    replay_recorded_only: bool = False
    #: how many of the fastest configs to re-time with `final_budget_ms` at the end (not in replay)
    finalists: int = 5
    final_budget_ms: float = 300.0
    #: ... but no more than this many repetitions' worth of it (at the screening median): a median of 200
    #: flushed launches is steady, and 300 ms of a 0.15 ms kernel would be ~2,000 of them, ~0.5 s each finalist
    final_reps: int = 200

    @property
    def recording(self) -> str | None:
        """The one recording a study of one problem answers from (`replay`; see `__post_init__`)."""
        assert not isinstance(self.replay, list), "a study over several problems has a recording per problem"
        return self.replay

    def __post_init__(self) -> None:
        # `replay` is a list only for a study over several problems (`problems`: one recording each, matched by
        # `tuner.study.shapes`); a study of one problem holds its one recording as a path.
        if isinstance(self.replay, list) and self.problems is None:
            if len(self.replay) > 1:
                raise InputError("--replay is given once, or once per problem with --problems")
            self.replay = self.replay[0] if self.replay else None
        if self.one_at_a_time and self.problems is None:
            raise InputError("--one-at-a-time orders the studies of several problems: give it with --problems")
        self._check()

    def _check(self) -> None:
        """Refuse a study no face may ask for: the one check of the options as a whole (a keyword's or a flag's
        value is checked first, in its own words, by its `Option` or argparse; options made in code meet this
        alone). The driver, the engines and the runner of several problems trust what passed. Imports inside: the
        command line reads this module before the study's imports."""
        from tuner.study.preflight import check_study_name
        from tuner.study.search import check_budget

        if self.trials < 1:
            raise InputError(f"--trials {self.trials}: must be ≥ 1")
        if self.sampler not in SAMPLERS:
            raise InputError(f"--sampler {self.sampler}: unknown (choose from {', '.join(SAMPLERS)})")
        check_budget(self.sampler, self.trials)
        check_study_name(self.study_name)
        if self.objectives not in ("first", "all"):
            raise InputError(f"--objectives {self.objectives}: choose first or all")
        limits.replay_delay(self.replay_delay_s)
        engine = engine_of(self)
        if engine not in ENGINES:
            raise InputError(f"--engine {engine}: unknown (choose from {', '.join(ENGINES)})")
        if engine == "local" and self.ray_address:
            raise InputError("--engine local runs on this machine alone; drop --ray-address or use --engine ray")
        if self.problems is not None:
            if self.study_name:
                raise InputError(
                    "--study-name names one study; with --problems each problem's study has its default name"
                )
            if self.problem:
                raise InputError("give --problem or --problems, not both")


@cache
def options() -> tuple[Option, ...]:
    """Every field of `StudyOptions` that is set from outside, in field order."""
    out = []
    for f in dataclasses.fields(StudyOptions):
        spec = f.metadata.get("option")
        if spec is None:
            continue
        default = None if f.default is dataclasses.MISSING else f.default
        choices = spec["choices"]
        if choices is not None and default is not None:
            default = next(name for name, value in choices.items() if value == default)
        annotation = spec["annotation"] or str(f.type)
        if choices is not None and spec["annotation"] is None:
            annotation = "str" if default is not None else "str | None"  # the names, not the field's values
        keyword_default = default if spec["keyword_default"] is _FROM_FIELD else spec["keyword_default"]
        out.append(
            Option(
                field=f.name,
                flag="--" + f.name.replace("_", "-") if spec["flag"] is _FROM_FIELD else spec["flag"],
                keyword=f.name if spec["keyword"] is _FROM_FIELD else spec["keyword"],
                help=spec["help"],
                metavar=spec["metavar"],
                kind=spec["kind"],
                choices=choices,
                negated=spec["negated"],
                many=spec["many"],
                required=spec["required"],
                default=default,
                keyword_default=keyword_default,
                annotation=annotation,
                to_field=spec["to_field"],
            )
        )
    return tuple(out)


def flags() -> list[Option]:
    """The options ``tuner study`` takes, in the order its ``--help`` lists them."""
    return [o for o in options() if o.flag is not None]


def keywords() -> dict[str, Option]:
    """The keyword arguments of `tuner.study` → their options, in field order."""
    return {o.keyword: o for o in options() if o.keyword is not None}


def by_field(name: str) -> Option:
    return next(o for o in options() if o.field == name)


def check_call(
    trials: Any, given: Mapping[str, Any], *, caller: str = "tuner.study", others: Sequence[str] = ()
) -> dict[str, Any]:
    """`tuner.study`'s `trials` and keywords `given`, checked (an unknown keyword, or a value its option cannot
    take, is an InputError of one line); the keywords, those not given at their defaults. `caller` and the names it
    takes itself (`others`) are for the message."""
    import difflib

    by_field("trials").check(trials)
    known = keywords()
    for name in given:
        if name not in known:
            close = difflib.get_close_matches(name, [*others, *known], n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"it takes {', '.join([*others, *known])}"
            raise InputError(f"{caller} has no keyword {name!r}: {hint}")
    return {name: o.check(given[name]) if name in given else o.keyword_default for name, o in known.items()}


def from_keywords(space: str, trials: int, values: Mapping[str, Any]) -> StudyOptions:
    """The options of a study of `space` to `trials` trials, from `check_call`'s keywords (`kernel` resolved)."""
    known = keywords()
    fields = {known[name].field: known[name].field_value(value) for name, value in values.items()}
    return StudyOptions(space=space, trials=trials, **fields)


def _alternatives(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def engine_of(opts: StudyOptions) -> str:
    """The engine a study runs on (`engine_for` its options)."""
    return engine_for(opts.engine, opts.ray_address)


def engine_for(engine: str | None, ray_address: str | None) -> str:
    """The engine a study asked for `engine` with `ray_address` runs on: `engine`, else ray with a `ray_address`,
    else local."""
    return engine or ("ray" if ray_address else "local")


def default_study_name(space: space_mod.SearchSpace, problem: space_mod.Problem, gpu: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{space.kernel}-{problem.label()}-{gpu}")

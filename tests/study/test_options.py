"""The study's options, declared once (`tuner.study.options.StudyOptions`): the flags of ``tuner study``, the
keywords of `tuner.study` and their checks all come from that declaration, and say the same."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

import tuner
from tuner.cli.main import build_parser, main
from tuner.core.errors import InputError
from tuner.study import options
from tuner.study.options import StudyOptions

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"


def _study_parser():
    parser = build_parser()
    return next(a for a in parser._actions if a.dest == "command").choices["study"]  # noqa: SLF001


def _actions():
    return {a.option_strings[0] if a.option_strings else a.dest: a for a in _study_parser()._actions}  # noqa: SLF001


def test_every_flag_of_the_declaration_is_in_the_parser_with_its_default_help_and_choices():
    actions = _actions()
    for o in options.flags():
        action = actions[o.flag]
        assert action.help == o.help, o.flag
        assert action.metavar == o.metavar, o.flag
        assert action.required == (o.required or o.positional), o.flag
        if o.is_switch:
            assert action.nargs == 0 and action.default is False, o.flag
            assert o.default is o.negated  # the switch says the value that is not the default
        else:
            assert action.default == (None if o.positional else o.default), o.flag
            assert action.choices == (None if o.choices is None else tuple(o.choices)), o.flag
    assert set(actions) - {o.flag for o in options.flags()} == {"-h"}


def test_the_flags_keep_their_names_and_defaults():
    """What the docs and the scripts spell (docs/commands.md): the names, and the renames of the declaration."""
    flags = {o.field: o.flag for o in options.flags()}
    assert flags["replay_delay_s"] == "--replay-delay" and flags["screen_budget_ms"] == "--screen-ms"
    assert flags["ordered"] == "--categorical" and flags["progress"] == "--json" and flags["kernel"] == "kernel"
    defaults = vars(build_parser().parse_args(["study", "transpose", "--trials", "3"]))
    assert {k: defaults[k] for k in ("sampler", "timeout", "replay_delay", "repair", "screen_cutoff", "screen_ms")} == {
        "sampler": "forest",
        "timeout": 60.0,
        "replay_delay": 0.0,
        "repair": "nearest",
        "screen_cutoff": 1.05,
        "screen_ms": 5.0,
    }
    assert not any(defaults[k] for k in ("categorical", "json", "takeover", "in_process"))


def test_every_keyword_of_the_api_is_a_field_and_the_signature_lists_them():
    names = {f.name for f in dataclasses.fields(StudyOptions)}
    keywords = options.keywords()
    assert all(o.field in names for o in keywords.values())
    assert {"replay_delay": "replay_delay_s", "screen_ms": "screen_budget_ms", "ordered": "ordered"}.items() <= {
        name: o.field for name, o in keywords.items()
    }.items()
    signature = inspect.signature(tuner.study)
    assert list(signature.parameters) == ["space", "trials", *keywords]
    for name, o in keywords.items():
        parameter = signature.parameters[name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default == o.keyword_default
        assert f"``{name}={o.keyword_default!r}``" in tuner.study.__doc__
    assert signature.parameters["progress"].default is False and signature.parameters["repair"].default == "nearest"
    # set by code alone: neither a flag nor a keyword
    assert not {"finalists", "inside_valid_set", "replay_in_flight"} & {o.field for o in options.options()}


@pytest.mark.parametrize(
    "keywords, message",
    [
        ({"screen_budget_ms": 5}, "tuner.study has no keyword 'screen_budget_ms': did you mean 'screen_ms'?"),
        ({"frobnicate": 1}, "tuner.study has no keyword 'frobnicate': it takes kernel, storage, "),
        ({"repair": "closest"}, "repair 'closest': choose nearest or random"),
        ({"sampler": "anneal"}, "sampler 'anneal': choose forest, tpe, nsga2, gp, cmaes, random or grid"),
        ({"engine": "cloud"}, "engine 'cloud': choose local or ray"),
        ({"objectives": "best"}, "objectives 'best': choose first or all"),
        ({"gpus": 0}, "gpus 0: a positive integer"),
        ({"gpus": 1.5}, "gpus 1.5: a positive integer"),
        ({"timeout": 0}, "timeout 0: a positive number of seconds"),
        ({"timeout": "60"}, "timeout '60': a positive number of seconds"),
        ({"replay_delay": -1}, "replay_delay -1: a finite number of seconds ≥ 0"),
        ({"replay_delay": float("inf")}, "replay_delay inf: a finite number of seconds ≥ 0"),
        ({"screen_cutoff": 1.0}, "screen_cutoff 1.0: a factor above 1, or None"),
        ({"screen_ms": 0}, "screen_ms 0: a positive number of milliseconds"),
        ({"seed": 1.5}, "seed 1.5: an integer"),
        ({"trials": 0}, "trials 0: a positive integer"),
    ],
)
def test_a_bad_keyword_or_value_is_one_line_before_anything_starts(keywords, message, monkeypatch):
    import tuner.build.cachedirs

    monkeypatch.setattr(tuner.build.cachedirs, "ensure_writable", lambda: pytest.fail("the call went on"))
    trials = keywords.pop("trials", 1)
    with pytest.raises(InputError) as caught:
        tuner.study("transpose", trials, replay=str(RECORDING), **keywords)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_none_is_taken_where_the_option_is_off_or_unset():
    given = options.check_call(3, {"screen_cutoff": None, "gpus": None, "seed": None, "engine": None})
    assert given["screen_cutoff"] is None and given["gpus"] is None and given["engine"] is None
    with pytest.raises(InputError, match="trials None: a positive integer"):
        options.check_call(None, {})


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--trials", "x"], "argument --trials: expected a positive integer, got 'x'"),
        (["--gpus", "-2"], "argument --gpus: must be ≥ 1, got -2"),
        (["--timeout", "0"], "argument --timeout: must be > 0, got 0"),
        (["--replay-delay", "nan"], "argument --replay-delay: must be a finite number ≥ 0, got nan"),
        (["--replay-delay", "y"], "argument --replay-delay: expected a number of seconds, got 'y'"),
        (
            ["--screen-cutoff", "1"],
            "argument --screen-cutoff: must be above 1 or off (at 1 or below even a new best would be cut), got 1",
        ),
        (["--screen-cutoff", "abc"], "argument --screen-cutoff: expected a factor above 1 or off, got 'abc'"),
        (["--screen-ms", "q"], "argument --screen-ms: expected a positive number, got 'q'"),
        (["--seed", "1.5"], "argument --seed: invalid int value: '1.5'"),
        (["--repair", "closest"], "argument --repair: invalid choice: 'closest' (choose from 'nearest', 'random')"),
    ],
)
def test_a_bad_flag_is_the_same_one_line_as_before(flags, message):
    with pytest.raises(InputError) as caught:
        build_parser().parse_args(["study", "transpose", "--trials", "3", *flags])
    assert str(caught.value) == f"tuner study: {message}"


@pytest.mark.parametrize("word", ["off", "OFF", " none "])
def test_screen_cutoff_off(word):
    assert build_parser().parse_args(["study", "t", "--trials", "1", "--screen-cutoff", word]).screen_cutoff is None


def test_the_command_line_and_the_call_make_the_same_options(monkeypatch):
    """Each flag reaches its field through its keyword, renames and all."""
    made: list[StudyOptions] = []
    driver = importlib.import_module("tuner.study.driver")
    monkeypatch.setattr(
        driver, "run_study", lambda opts, prelude=None, space=None, ahead=None: made.append(opts) or {"trials": 0}
    )
    flags = "--categorical --repair random --replay-delay 0.5 --screen-ms 2 --screen-cutoff off --json --seed 3"
    flags += " --gpus 2 --timeout 9 --in-process --takeover --replay-study s --problem p --objectives all"
    flags += " --engine local --sampler grid --storage sqlite:///x.db --study-name nm"
    assert main(["study", "transpose", "--trials", "5", "--replay", str(RECORDING), *flags.split()]) == 0
    tuner.study(
        "transpose",
        5,
        **dict(replay=RECORDING, ordered=False, repair="random", replay_delay=0.5, screen_ms=2.0, screen_cutoff=None),
        **dict(progress=False, seed=3, gpus=2, timeout=9.0, in_process=True, takeover=True, replay_study="s"),
        **dict(problem="p", objectives="all", engine="local", sampler="grid", storage="sqlite:///x.db"),
        study_name="nm",
    )
    expected = StudyOptions(
        kernel="transpose",
        space="transpose",
        trials=5,
        storage="sqlite:///x.db",
        study_name="nm",
        sampler="grid",
        seed=3,
        gpus=2,
        timeout=9.0,
        engine="local",
        replay=str(RECORDING),
        replay_delay_s=0.5,
        takeover=True,
        replay_study="s",
        in_process=True,
        repair=False,
        objectives="all",
        ordered=False,
        screen_cutoff=None,
        screen_budget_ms=2.0,
        problem="p",
        progress=False,
    )
    assert made == [expected, expected]
    made.clear()
    main(
        [
            "study",
            str(ROOT / "search_spaces" / "transpose.yaml"),
            "--trials",
            "3",
            "--replay",
            str(RECORDING),
            "--in-process",
        ]
    )
    tuner.study("transpose", 3, replay=str(RECORDING))
    cli, api = made
    assert (cli.kernel, cli.progress, cli.repair, cli.ordered) == ("transpose", True, True, True)
    assert (api.kernel, api.progress, api.screen_budget_ms, api.replay_delay_s) == ("transpose", False, 5.0, 0.0)

"""``tuner study``: a thin layer over `tuner.study` (the API call), which starts the GPU workers as early as it may."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tuner.cli.args import flag_type
from tuner.study import options
from tuner.study.ahead import Ahead


def _start_gpu_workers_early(args: argparse.Namespace, kernel: str | None, ahead: Ahead) -> None:
    """Start the local engine's GPU worker processes before the study's own imports and set-up (Optuna, the
    space, the storage), which they overlap; a study refused meanwhile stops them on exit. First the checks that
    take milliseconds (`tuner.study.preflight`: the study's name; `tuner.store.probe`: a SQLite file's storage,
    which must take a write), so that a study refused by them starts no worker; and none start for a study that may
    hold its trials already: the driver's exact check then comes first (it starts them itself otherwise)."""
    from tuner.gpu import discovery
    from tuner.store.dbfiles import plain_sqlite_file, study_storage_url
    from tuner.store.probe import check_storage
    from tuner.study import preflight

    preflight.check_study_name(args.study_name)
    url = study_storage_url(args.storage, kernel or "") if args.storage is not None or kernel else None
    if url and plain_sqlite_file(url) is not None:  # another URL needs SQLAlchemy, or a server: the driver's
        check_storage(url, given=args.storage is not None)
    if kernel and preflight.maybe_complete(args.storage, kernel, args.trials, args.study_name):
        return
    available = discovery.local_gpus() or 0
    ahead.launch_gpu_workers(min(args.gpus or available, available), timeout_s=args.timeout)


def cmd_study(args: argparse.Namespace) -> int:
    if args.space is None and args.kernel.endswith((".yaml", ".yml")):
        # `tuner study my_space.yaml ...`: the space file names its kernel
        args.space, args.kernel = args.kernel, None
    kernel = args.kernel
    ahead = args.ahead or Ahead()  # `tuner.cli.main.main` started the writer in it
    if (args.engine in (None, "local") and not args.ray_address) and not (args.replay or args.in_process):
        _start_gpu_workers_early(args, kernel, ahead)
    from tuner.api import study_ahead

    summary = study_ahead(ahead, args.space or kernel, args.trials, **_keywords(args)).summary
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    # The study has closed its GPU workers, its writer and its database; without Ray (whose exit handler stops the
    # cluster it started) nothing is left for the interpreter's teardown to do but spend a few tenths of a second.
    args.exit_at_once = "ray" not in sys.modules
    return 0


def _keywords(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords of `tuner.study` that the flags say (``--categorical`` is ``ordered=False``, ``--json``
    ``progress=False``)."""
    out = {}
    for o in options.flags():
        if o.keyword is not None:
            value = getattr(args, _dest(o))
            out[o.keyword] = not value if o.negated else value
    return out


def add_commands(sub: argparse._SubParsersAction) -> None:
    """study: a flag for each option `tuner.study.options.StudyOptions` declares as one."""
    p = sub.add_parser("study", help="run (or resume) an Optuna study over this machine's GPUs (or a Ray cluster's)")
    for o in options.flags():
        p.add_argument(o.flag, **_argument(o))
    p.set_defaults(func=cmd_study, ahead=None)


def _argument(o: options.Option) -> dict[str, Any]:
    """`add_argument`'s keywords for option `o`: a switch (its default False: the flag says the other value), a
    positional argument, or a flag with a value."""
    if o.is_switch:
        assert o.default is o.negated, f"{o.flag}: a switch must change its option's default"
        return {"action": "store_true", "help": o.help}
    out: dict[str, Any] = {"help": o.help, "metavar": o.metavar}
    if o.many:
        out["action"] = "append"
    if o.kind is not None:
        out["type"] = flag_type(o.kind)
    if o.choices is not None:
        out["choices"] = tuple(o.choices)
    if not o.positional:
        out.update(default=o.default, required=o.required)
    return out


def _dest(o: options.Option) -> str:
    """The attribute argparse gives option `o`'s value: its flag's name, ``-`` as ``_``."""
    assert o.flag is not None
    return o.flag.lstrip("-").replace("-", "_")

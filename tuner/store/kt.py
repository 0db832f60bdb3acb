"""Kernel Tuner cache files: read them as replay recordings, turn them into spaces, write studies as them.

A Kernel Tuner (1.x) cache is JSON: a header (``device_name``, ``kernel_name``, ``problem_size``,
``tune_params_keys``, ``tune_params``, ``objective``) and ``cache``, a mapping from the comma-joined values of a
config (in ``tune_params_keys`` order) to an entry holding the config's params and ``time`` in milliseconds, or a
failure string in ``time``: ``InvalidConfig`` (the config breaks a limit of the device), ``CompilationFailedConfig``
or ``RuntimeFailedConfig``. Kernel Tuner appends entries as it goes, so a cache of an interrupted run lacks the
closing braces (and may end in a comma); `read_cache` accepts that, and ``.json.gz``.

A kernel Kernel Tuner tuned is arbitrary user code, not one of our families: its space uses the replay-only
family ``kt`` (`tuner.kernels.kt`), which has no template and can only be answered from the cache.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError

#: Kernel Tuner's failure strings → our failure kinds
FAILURES = {
    "InvalidConfig": "invalid",
    "CompilationFailedConfig": "compile_failed",
    "RuntimeFailedConfig": "launch_failed",
}
#: and back (kinds Kernel Tuner has no word for are runtime failures to it)
KT_FAILURE = {"invalid": "InvalidConfig", "compile_failed": "CompilationFailedConfig"}
#: Kernel Tuner marks failed configs with this time in caches written before the failure strings existed
OLD_FAILED_TIME = 1e20


def is_cache_path(path: str | Path) -> bool:
    name = str(path).lower()
    return name.endswith(".json") or name.endswith(".json.gz")


def read_cache(path: str | Path) -> dict[str, Any]:
    """The parsed cache; InputError (file and fault) for anything that is not a Kernel Tuner cache."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        text = raw.decode().strip()
    except FileNotFoundError:
        raise InputError("no such Kernel Tuner cache file", str(path)) from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", str(path)) from None
    except zlib.error as exc:  # a gzip header over a damaged stream: gzip raises zlib's own error
        raise InputError(f"cannot decompress: corrupt gzip data ({exc})", str(path)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        try:  # an unfinished cache: Kernel Tuner closes it as it reads it, so do we
            data = json.loads(text.rstrip(",") + "}\n}")
        except json.JSONDecodeError:
            raise InputError(f"not JSON (line {exc.lineno}): {exc.msg}", str(path)) from None
    for key in ("tune_params_keys", "tune_params", "cache"):
        if not isinstance(data, dict) or key not in data:
            raise InputError(f"not a Kernel Tuner cache: no {key!r}", str(path))
    keys, params = data["tune_params_keys"], data["tune_params"]
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise InputError("tune_params_keys is not a list of names", str(path))
    if not isinstance(params, dict) or not all(isinstance(v, list) for v in params.values()):
        raise InputError("tune_params is not a mapping of name: list of values", str(path))
    if not isinstance(data["cache"], dict):
        raise InputError("'cache' is not a mapping of config: entry", str(path))
    if list(keys) != [k for k in keys if k in params] or set(keys) != set(params):
        raise InputError("tune_params_keys and tune_params name different params", str(path))
    return data


def _objective(data: dict[str, Any]) -> str:
    """The cache's objective: a name (Kernel Tuner 0.4/1.0), or a list of names (1.5 writes ``["time"]``), of which
    the first is the one it optimised."""
    objective = data.get("objective") or "time"
    if isinstance(objective, list):
        objective = objective[0] if objective else "time"
    return str(objective)


def _failure(entry: dict[str, Any], objective: str) -> str | None:
    value = entry.get(objective, entry.get("time"))
    if isinstance(value, str):
        return FAILURES.get(value, "launch_failed")
    if value is None or not isinstance(value, int | float) or not math.isfinite(value) or value >= OLD_FAILED_TIME:
        return "launch_failed"
    return None


def records(data: dict[str, Any], path: str = "") -> dict[str, tuple[str, dict[str, Any]]]:
    """params key → (state, attrs) as `tuner.study.replay.load_records` returns them, one per cache entry.

    A measured entry becomes a Measurement whose ``median_ms`` is the cache's time; figures Kernel Tuner does not
    record (bytes, registers, SMEM) are 0 unless the entry was written by `write_cache`, which keeps ours under
    ``"tuner"``. A failure string becomes the matching failure kind."""
    from tuner.space.space import params_key

    keys = list(data["tune_params_keys"])
    objective = _objective(data)
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for cache_key, entry in data["cache"].items():
        if not isinstance(entry, dict) or any(k not in entry for k in keys):
            raise InputError(f"cache entry {cache_key!r} lacks tunable params", path)
        params = {k: entry[k] for k in keys}
        kind = _failure(entry, objective)
        if kind is not None:
            raw = entry.get(objective, entry.get("time"))
            out[params_key(params)] = ("FAIL", {"failure": kind, "reason": f"Kernel Tuner cache: {raw}"})
            continue
        recorded = entry.get("tuner")
        ours = recorded if isinstance(recorded, dict) else {}
        time_ms = float(entry["time"])
        times = [float(t) for t in entry.get("times") or [] if isinstance(t, int | float)]
        attrs = {
            "median_ms": time_ms,
            "p20_ms": time_ms,
            "p80_ms": time_ms,
            "repetitions": len(times),
            "bytes_moved": 0,
            "flops": 0,
            "tbps": 0.0,
            "tflops": 0.0,
            "ceiling_tbps": 0.0,
            "fraction_of_ceiling": 0.0,
            "registers": 0,
            "smem_static_bytes": 0,
            "smem_dynamic_bytes": 0,
            "spill_bytes": 0,
            "gpu": str(data.get("device_name", "")),
        }
        if len(times) >= 2:
            ordered = sorted(times)
            attrs["p20_ms"] = ordered[int(0.2 * (len(ordered) - 1))]
            attrs["p80_ms"] = ordered[int(0.8 * (len(ordered) - 1))]
        attrs.update(ours)
        attrs["median_ms"] = time_ms
        out[params_key(params)] = ("COMPLETE", attrs)
    return out


# ---------------------------------------------------------------------------------------------------------------
# cache → space


def _valid_rows(data: dict[str, Any], keys: list[str], source: str) -> list[tuple[Any, ...]]:
    """The configs of the cache that are not InvalidConfig, in cache order, once each."""
    objective = _objective(data)
    rows: dict[tuple[Any, ...], None] = {}
    for cache_key, entry in data["cache"].items():
        if not isinstance(entry, dict) or any(k not in entry for k in keys):
            raise InputError(f"cache entry {cache_key!r} lacks tunable params", source)
        if _failure(entry, objective) != "invalid":
            row = tuple(entry[k] for k in keys)
            for name, value in zip(keys, row, strict=True):
                if isinstance(value, list | dict) or value not in data["tune_params"][name]:
                    raise InputError(
                        f"cache entry {cache_key!r}: {name}={value!r} is not one of its tune_params", source
                    )
            rows.setdefault(row)
    if not rows:
        raise InputError("the cache holds no valid config", source)
    return list(rows)


#: most Cartesian configs over which carried-over restrictions are checked to describe the valid set exactly
RESTRICTION_WALK = 2_000_000


def _restriction_texts(data: dict[str, Any], given: list[str] | None, source: str) -> list[str]:
    """Kernel Tuner's restrictions as text: those `given` (``import-kt --restrictions``), else a cache's own
    ``"restrictions"`` (a list of strings), where it has one."""
    if given is not None:
        return list(given)
    from tuner.space.reading import constraint_list

    own = constraint_list(data.get("restrictions"))
    if not isinstance(own, list) or not all(isinstance(r, str) for r in own):
        raise InputError("'restrictions' must be a list of expression strings (or one)", source)
    return own


def carried_restrictions(
    texts: list[str], keys: list[str], valid: list[tuple[Any, ...]]
) -> tuple[list[str], list[str]]:
    """(kept, notes): each Kernel Tuner restriction that parses as our expression, reads only tunable params and
    holds for every valid config of the cache is kept as a constraint; `notes` say why any other was left out."""
    from tuner.expr import Expr, ExprError

    kept, notes = [], []
    for text in texts:
        try:
            expr = Expr.parse(text)
        except ExprError as exc:
            notes.append(f"restriction {text!r} left out: {exc}")
            continue
        unknown = sorted(expr.names - set(keys))
        if unknown:
            notes.append(f"restriction {text!r} left out: it reads {', '.join(unknown)}, which are not tunable params")
            continue
        broken = 0
        for row in valid:
            try:
                broken += not expr(dict(zip(keys, row, strict=True)))
            except (ArithmeticError, TypeError, ValueError):
                broken += 1
        if broken:
            notes.append(f"restriction {text!r} left out: {broken:,} of the cache's valid configs break it")
            continue
        kept.append(text)
    return kept, notes


def _restrictions_exact(kept: list[str], params: dict[str, list[Any]], valid: int) -> bool:
    """Whether the combinations of `params` that meet every kept restriction are exactly as many as the valid
    configs (all of which meet them: `carried_restrictions`), so that the constraints alone describe them."""
    import itertools

    from tuner.expr import Expr

    cartesian = 1
    for values in params.values():
        cartesian *= len(values)
    if not kept or cartesian > RESTRICTION_WALK:
        return False
    exprs = [Expr.parse(t) for t in kept]
    names = list(params)
    count = 0
    for combo in itertools.product(*params.values()):
        env = dict(zip(names, combo, strict=True))
        try:
            count += all(e(env) for e in exprs)
        except (ArithmeticError, TypeError, ValueError):
            continue
        if count > valid:
            return False
    return count == valid


def space_files(
    data: dict[str, Any], source: str, out: str | Path, restrictions: list[str] | None = None
) -> tuple[str, str | None, int, list[str]]:
    """The space a cache describes, for writing to `out`: (its YAML text, the text of the configs file beside it
    or None, the number of valid configs, notes on restrictions left out). The space's valid configs are exactly
    the cache's configs that are not InvalidConfig: its params keep the values some valid config uses; Kernel
    Tuner's restrictions (`restrictions`, else the cache's own) that parse as our expressions become its
    constraints (`carried_restrictions`); and where those do not single out the valid configs, it lists them
    (``configs:``, `tuner.space.configs`): inline up to `INLINE_CONFIGS` configs, else in
    ``<out stem>.configs.json`` beside the space. Any size of cache imports; faults name the cache (`source`)."""
    import yaml

    from tuner.kernels.plain import C_IDENTIFIER_RULE
    from tuner.space.configs import INLINE_CONFIGS, MAX_CONFIGS
    from tuner.space.reading import IDENTIFIER

    keys = list(data["tune_params_keys"])
    for name in keys:
        # a param reaches CUDA as a #define: a C identifier, not merely a Python one
        if not isinstance(name, str) or not IDENTIFIER.fullmatch(name) or name.startswith("__"):
            raise InputError(
                f"tunable param {name!r} is not a C identifier ({C_IDENTIFIER_RULE}); the space cannot name it", source
            )
    valid = _valid_rows(data, keys, source)
    if len(valid) > MAX_CONFIGS:
        raise InputError(
            f"the cache holds {len(valid):,} valid configs, more than a space lists ({MAX_CONFIGS:,})", source
        )
    # Values no valid config uses are dropped from the params: they would only make invalid proposals.
    used = [{v for v in (row[i] for row in valid)} for i in range(len(keys))]
    params = {
        k: list(dict.fromkeys(v for v in data["tune_params"][k] if not isinstance(v, list | dict) and v in used[i]))
        for i, k in enumerate(keys)
    }
    for k, values in params.items():
        for v in values:
            if v is None or (isinstance(v, str) and not IDENTIFIER.fullmatch(v)):
                raise InputError(
                    f"tunable param {k!r}: value {v!r} cannot be a space's value (a string must be an identifier)",
                    source,
                )
    cartesian = 1
    for values in params.values():
        cartesian *= len(values)
    kept, notes = carried_restrictions(_restriction_texts(data, restrictions, source), keys, valid)
    name = re.sub(r"[^A-Za-z0-9_]+", "_", str(data.get("kernel_name") or "kernel")).strip("_") or "kernel"
    doc: dict[str, Any] = {
        "kernel": "kt",
        "description": f"Imported from the Kernel Tuner cache {Path(source).name} (kernel "
        f"{data.get('kernel_name')!r} on {data.get('device_name')!r}, problem size "
        f"{data.get('problem_size')!r}): its {len(valid):,} valid configs. Replay only: answer it with --replay on "
        "that cache.",
        "problem": {"name": name, "dtype": "float32"},
        "params": params,
        **({"constraints": kept} if kept else {}),
        "objectives": [{"time_ms": "minimize"}],
    }
    doc["default"] = middle_config(params, valid, keys)
    rows = [list(row) for row in valid]
    configs_text = None
    if cartesian != len(valid) and not _restrictions_exact(kept, params, len(valid)):
        if len(valid) <= INLINE_CONFIGS:
            doc["configs"] = rows
        else:
            configs_name = f"{Path(out).stem}.configs.json"
            doc["configs"] = configs_name
            body = ",\n".join(json.dumps(row) for row in rows)
            configs_text = f'{{"params": {json.dumps(keys)},\n"configs": [\n{body}\n]}}\n'
    text = yaml.safe_dump(doc, sort_keys=False, width=10_000, default_flow_style=None)
    return text, configs_text, len(valid), notes


def middle_config(params: dict[str, list[Any]], valid: list[tuple[Any, ...]], keys: list[str]) -> dict[str, Any]:
    """The valid config nearest the middle of every param's values (steps along each param's sorted values, or
    declared ones for strings and booleans): the space's default, measured first. The first valid config would be
    the smallest value of every param, an edge of the space (the thinnest blocks, the smallest tiles)."""
    rank = []
    for k in keys:
        values = params[k]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        ordered = sorted(values) if numeric else values
        rank.append({v: i - (len(values) - 1) / 2 for i, v in enumerate(ordered)})
    best = min(valid, key=lambda row: sum(abs(r[v]) for r, v in zip(rank, row, strict=True)))
    return dict(zip(keys, best, strict=True))


def space_text(data: dict[str, Any], source: str) -> tuple[str, int]:
    """The space YAML of a cache whose valid configs fit inline (`space_files`), and their count."""
    from tuner.space.configs import INLINE_CONFIGS

    text, configs_text, valid, _ = space_files(data, source, "space.yaml")
    if configs_text is not None:
        raise InputError(f"the cache's {valid:,} valid configs do not fit inline ({INLINE_CONFIGS:,})", source)
    return text, valid


def write_space(
    data: dict[str, Any], source: str, out: str | Path, restrictions: list[str] | None = None
) -> tuple[int, Path | None, list[str]]:
    """Write the space of a cache to `out` (and its configs file beside it, where it needs one), atomically; the
    number of valid configs, the configs file written (None: none) and notes on restrictions left out."""
    from tuner.build.files import atomic_write

    out = Path(out)
    text, configs_text, valid, notes = space_files(data, source, out, restrictions)
    configs_path = None
    if configs_text is not None:
        configs_path = out.with_name(f"{out.stem}.configs.json")
        atomic_write(configs_path, configs_text)
    atomic_write(out, text)
    return valid, configs_path, notes


# ---------------------------------------------------------------------------------------------------------------
# study → cache


def cache_from_study(study, params_order: list[str] | None = None) -> dict[str, Any]:
    """A Kernel Tuner cache of `study`: one entry per evaluated config (duplicates and proposals answered without
    evaluation left out), ``time`` the median in ms, failures as Kernel Tuner's strings. Our figures go along
    under ``"tuner"`` so a round trip loses nothing. ``benchmark_time`` holds the trial's whole wall time (ours
    does not split compile, verification and timing); ``compile_time`` and ``verification_time`` are 0."""
    trials = study.get_trials(deepcopy=False)
    evaluated = [
        t
        for t in trials
        if t.params
        and "duplicate_of" not in t.user_attrs
        and "screened" not in t.user_attrs
        and t.state.name in ("COMPLETE", "FAIL", "PRUNED")
        and t.user_attrs.get("failure") != "interrupted"
    ]
    if not evaluated:
        raise InputError(f"study {study.study_name} has no evaluated trials to write")
    keys = params_order or list(evaluated[0].distributions)
    tune_params = {
        k: list(evaluated[0].distributions[k].choices) if hasattr(evaluated[0].distributions[k], "choices") else []
        for k in keys
    }
    attrs = study.user_attrs
    problem = attrs.get("problem") or {}
    cache: dict[str, Any] = {}
    for t in evaluated:
        key = ",".join(str(t.params[k]) for k in keys)
        entry: dict[str, Any] = {k: t.params[k] for k in keys}
        wall_ms = (t.duration.total_seconds() * 1000.0) if t.duration else 0.0
        failure = t.user_attrs.get("failure")
        if t.state.name == "COMPLETE" and failure is None:
            entry["time"] = float(t.user_attrs["median_ms"])
            entry["tuner"] = {k: v for k, v in t.user_attrs.items() if k not in ("clocks", "versions", "derived")}
        else:
            entry["time"] = KT_FAILURE.get(failure or "", "RuntimeFailedConfig")
            entry["tuner"] = {"failure": failure, "reason": t.user_attrs.get("reason", "")}
        entry.update(
            {
                "compile_time": 0.0,
                "verification_time": 0.0,
                "benchmark_time": round(wall_ms, 3),
                "strategy_time": 0.0,
                "framework_time": 0.0,
                "timestamp": t.datetime_complete.isoformat() if t.datetime_complete else "",
            }
        )
        cache.setdefault(key, entry)
    return {
        "device_name": attrs.get("gpu", ""),
        "kernel_name": attrs.get("kernel", study.study_name),
        "problem_size": list((problem.get("sizes") or {}).values()),
        "tune_params_keys": keys,
        "tune_params": tune_params,
        "objective": "time",
        "cache": cache,
    }


def check_cache_path(path: str | Path) -> Path:
    """The path a Kernel Tuner cache can be written to (``.json`` or ``.json.gz``, in a folder that exists and
    can be written), else InputError. Nothing is created."""
    from tuner.build.files import check_writable

    path = Path(path)
    if not is_cache_path(path):
        raise InputError("--kt-cache: the file must end in .json or .json.gz", str(path))
    return check_writable(path, None, "--kt-cache")


def write_cache(study, path: str | Path, params_order: list[str] | None = None) -> Path:
    """Write `study` as a Kernel Tuner cache (``.json`` or ``.json.gz``), atomically. InputError (file and fault)
    where it cannot be written; nothing is left behind then."""
    from tuner.build.files import atomic_write

    path = check_cache_path(path)
    text = json.dumps(cache_from_study(study, params_order), indent=1)
    blob = gzip.compress(text.encode()) if path.name.endswith(".gz") else text.encode()
    return atomic_write(path, blob)

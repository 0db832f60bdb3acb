"""The C++17 header of tuned configs (`tuner export`): one `Config` per exported trial, grid formulas in the
problem sizes, and a constexpr `select` by shape. InputError for a namespace that is not a C++ identifier.

Python prepares plain data (`header_context`: C++ names, types and literals, grid formulas as `GridDim`); all the
C++ text is in the template ``export_templates/header.h.j2`` (package data), rendered by the strict environment
of `tuner.build.render`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, TypedDict

import jinja2
import optuna
from optuna.trial import FrozenTrial

from tuner.build.compile import target_arch
from tuner.build.files import atomic_write, check_writable
from tuner.build.render import entry_name, environment
from tuner.build.render import uri as kernel_uri
from tuner.core.errors import InputError
from tuner.core.gpufacts import DEFAULT_ARCH
from tuner.expr.ops import ceil_div
from tuner.kernels.plain import is_plain
from tuner.results.studies import StudyContext, best_trial, pareto_trials, render_trial, study_context
from tuner.results.studies import derived as recorded_derived
from tuner.store.reading import first_line
from tuner.store.schema import replay_only, throughput_unit

# C++ header


CPP_KEYWORDS = frozenset(
    """
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template
this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t
while xor xor_eq
""".split()
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Names the generated code uses itself; a size named like one of them gets a trailing underscore.
_RESERVED = frozenset({"arch", "launch", "p", "want", "best", "c", "d", "a", "b", "distance", "ratio"})


def check_namespace(namespace: str) -> str:
    """A C++ namespace name the header opens as ``namespace NAMESPACE::KERNEL {`` (C++17): an identifier, or
    identifiers joined by ``::`` (``prod::kernels``), none a keyword or reserved (``__`` anywhere, ``_`` and a
    capital first), and not inside ``std`` (declaring there is undefined behaviour). Else InputError, naming the
    part at fault."""
    usage = "letters, digits and _, not a keyword; nested with ::, as in prod::kernels"
    parts = namespace.split("::")
    if parts[0] == "std":
        raise InputError(f"--namespace {namespace!r}: a program may not declare names inside std ({usage})")
    for part in parts:
        if not part:
            raise InputError(f"--namespace {namespace!r}: an empty name around '::' ({usage})")
        if not _IDENT.match(part) or part in CPP_KEYWORDS:
            raise InputError(f"--namespace {namespace!r}: {part!r} is not a C++ identifier ({usage})")
        if "__" in part or re.match(r"_[A-Z]", part):
            raise InputError(
                f"--namespace {namespace!r}: {part!r} is reserved for the implementation (__, or _ and a capital)"
            )
    return namespace


def _cpp_name(name: str) -> str:
    name = re.sub(r"[^0-9A-Za-z_]", "_", name)
    name = re.sub(r"__+", "_", name)
    if not name or name[0].isdigit():
        name = f"c_{name}"
    return f"{name}_" if name in CPP_KEYWORDS or name in _RESERVED else name


def _cpp_type(values: Iterable[Any]) -> str:
    values = list(values)
    if all(isinstance(v, bool) for v in values):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "long long"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return "double"
    return "const char*"


def _cpp_value(value: Any, ctype: str) -> str:
    if ctype == "bool":
        return "true" if value else "false"
    if ctype == "long long":
        return str(int(value))
    if ctype == "double":
        value = float(value)
        return repr(value) if math.isfinite(value) else "0.0"
    return c_string(str(value))


def c_string(text: str) -> str:
    """A C/C++ string literal for any text: printable ASCII as is, quotes and backslashes escaped, everything
    else as octal escapes of its UTF-8 bytes (never \\u escapes, which C++17 forbids for basic characters)."""
    out = []
    for byte in text.encode():
        char = chr(byte)
        if char in '"\\?':  # '?' too: no trigraphs
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _raw_string(text: str) -> str:
    for delimiter in ("cuda", "cuda_src", "cuda_src_0", "cuda_src_1"):
        if f'){delimiter}"' not in text:
            return f'R"{delimiter}({text}){delimiter}"'
    return c_string(text)  # pathological: fall back to an escaped literal


class GridDim(TypedDict):
    """One grid dimension as data: the constant `value` (when `q` is None), or ceil_div(product of `sizes`, `q`)
    (`q` == 1: the product itself). `sizes` are the C++ member names of `Problem`, `names` the same sizes as the
    family names them; `tuned_only`: no formula fits, `value` is the tuned problem's."""

    value: int | None
    q: int | None
    sizes: list[str]
    names: list[str]
    tuned_only: bool


def _constant(value: int, tuned_only: bool = False) -> GridDim:
    return GridDim(value=value, q=None, sizes=[], names=[], tuned_only=tuned_only)


@dataclass
class _LaunchSpec:
    entry: str
    block: tuple[int, int, int]
    smem_dynamic: int
    args: tuple[str, ...]
    grid: list[GridDim]  # x, y, z


@dataclass
class _Exported:
    name: str
    study: optuna.Study
    trial: FrozenTrial
    ctx: StudyContext
    params: dict[str, Any]
    derived: dict[str, Any]
    launches: list[_LaunchSpec]
    grid_note: str
    source: str | None


def _fit_dim(values: list[tuple[dict[str, int], int]], sizes: list[str]) -> GridDim | None:
    """A formula g = c or g = ceil_div(product of some sizes, q) that reproduces every (sizes, g) probe. None when
    none fits."""
    base_sizes, g0 = values[0]
    if all(g == g0 for _, g in values):
        return _constant(g0)
    subsets: list[tuple[str, ...]] = [(s,) for s in sizes]
    subsets += [(a, b) for i, a in enumerate(sizes) for b in sizes[i + 1 :]]
    if len(sizes) > 2:
        subsets.append(tuple(sizes))
    for subset in subsets:
        product0 = math.prod(base_sizes[s] for s in subset)
        if g0 <= 0:
            continue
        for q in dict.fromkeys((product0 // g0, ceil_div(product0, g0))):
            if q <= 0:
                continue
            if all(ceil_div(math.prod(sz[s] for s in subset), q) == g for sz, g in values):
                return GridDim(
                    value=None, q=q, sizes=[_cpp_name(s) for s in subset], names=list(subset), tuned_only=False
                )
    return None


def _launch_specs(
    ctx: StudyContext, trial: FrozenTrial, params: dict[str, Any], derived: dict[str, Any], entry: str
) -> tuple[list[_LaunchSpec], str]:
    """The launches of a config with grid formulas in the problem sizes.

    `family.launches` is evaluated on the tuned problem and, one size at a time, on that size ×2 and ×3 (the
    config's derived values re-resolved for each, when the space file is available); each grid dimension is
    then the constant, or ceil_div(size or product of sizes, q), that reproduces every probe. A dimension that
    no such formula fits keeps the tuned problem's value, and the note says so.
    """
    from tuner.space import space as space_mod

    family, problem = ctx.family, ctx.problem
    sizes = list(problem.sizes)

    def config_for(p) -> dict[str, Any]:
        if ctx.space is not None:
            return ctx.space.resolve(params, p)
        return {**params, **derived}

    try:
        base = family.launches(entry, config_for(problem), problem.env)
    except (ValueError, ArithmeticError, KeyError, TypeError) as exc:
        raise InputError(
            f"trial {trial.number}: {family.name}.launches() fails on the tuned problem: {first_line(exc)}"
        ) from None
    probes: list[tuple[dict[str, int], list]] = [(dict(problem.sizes), base)]
    if ctx.space is not None:
        for name in sizes:
            for factor in (2, 3):
                scaled = {**problem.sizes, name: problem.sizes[name] * factor}
                p = space_mod.Problem(problem.name, problem.dtype, scaled)
                try:
                    launches = family.launches(entry, config_for(p), p.env)
                except (ValueError, ArithmeticError, KeyError, TypeError):
                    continue  # e.g. a tile that does not divide the scaled size
                if len(launches) == len(base):
                    probes.append((scaled, launches))
    notes = []
    if len(probes) == 1:
        notes.append(
            "grid is the tuned problem's only (no probes: "
            + (ctx.space_note or "launches() failed on every scaled problem")
            + ")"
        )
    specs = []
    for i, launch in enumerate(base):
        grid = []
        for d in range(3):
            fit = _fit_dim([(sz, ls[i].grid[d]) for sz, ls in probes], sizes)
            if fit is None:
                fit = _constant(launch.grid[d], tuned_only=True)
                notes.append(f"launch {i} grid.{'xyz'[d]}: no ceil_div formula fits; tuned problem only")
            grid.append(fit)
        specs.append(
            _LaunchSpec(
                entry=launch.entry,
                block=tuple(launch.block),
                smem_dynamic=launch.smem_dynamic,
                args=tuple(launch.args),
                grid=grid,
            )
        )
    return specs, "; ".join(notes)


def compile_target_note(text: str, arch: str) -> str:
    """The caveat for a config whose source compiles only for its arch's arch-specific target
    (`tuner.build.compile.target_arch`: sm_90 -> sm_90a for wgmma or setmaxnreg), so that a host program compiling the
    embedded source passes that target to NVRTC; "" for every other source. `arch` "" means the default arch."""
    base = arch or DEFAULT_ARCH
    target = target_arch(text, base)
    return "" if target == base else f"compile for {target}: the source uses PTX only {target} has"


def _exported_configs(studies: Sequence[optuna.Study], pick: str, with_source: bool) -> list[_Exported]:
    out: list[_Exported] = []
    for study in studies:
        if replay_only(study):
            raise InputError(
                f"study {study.study_name}: kernel {study.user_attrs.get('kernel')} has no template and can only be "
                "replayed, so it has no launches to export; `tuner best` prints its best params"
            )
        trials = [best_trial(study)] if pick == "fastest" else pareto_trials(study)
        ctx = study_context(study)
        if with_source and ctx.space is None:
            raise InputError(f"study {study.study_name}: cannot embed sources: {ctx.space_note}")
        for t in trials:
            order = list(ctx.space.params) if ctx.space is not None else list(t.params)
            params = {name: t.params[name] for name in order if name in t.params}
            derived = recorded_derived(t)
            if ctx.space is not None:
                resolved = ctx.space.resolve(params, ctx.problem)
                derived = {k: v for k, v in resolved.items() if k not in params}
            source = render_trial(ctx, t) if with_source else None
            if source is not None:
                entry = source.entry
            elif is_plain(ctx.family.template):  # a plain source's one __global__ function, whatever the config
                entry = entry_name(ctx.family, params)
            else:
                entry = str(t.user_attrs.get("uri") or "") or kernel_uri(ctx.family, params)
            launches, note = _launch_specs(ctx, t, params, derived, entry)
            text = source.text if source is not None else render_trial(ctx, t).text if ctx.space is not None else ""
            note = "; ".join(n for n in (note, compile_target_note(text, str(study.user_attrs.get("arch") or ""))) if n)
            out.append(
                _Exported(
                    name="",
                    study=study,
                    trial=t,
                    ctx=ctx,
                    params=params,
                    derived=derived,
                    launches=launches,
                    grid_note=note,
                    source=source.text if source else None,
                )
            )
    kernels_seen = {e.ctx.kernel for e in out}
    if len(kernels_seen) > 1:
        raise InputError(f"the studies are of several kernels ({', '.join(sorted(kernels_seen))}); name one")
    size_sets = {tuple(e.ctx.problem.sizes) for e in out}
    if len(size_sets) > 1:
        raise InputError(f"the studies name different problem sizes: {sorted(size_sets)}")
    param_sets = {tuple(e.params) for e in out}
    if len(param_sets) > 1:
        raise InputError(f"the studies have different params: {sorted(param_sets)}")
    # unique C++ names: the uri, then + problem, + arch, + a counter
    taken: set[str] = set()
    for e in out:
        uri = str(e.trial.user_attrs.get("uri") or kernel_uri(e.ctx.family, e.params))
        arch = str(e.study.user_attrs.get("arch") or "")
        for candidate in (uri, f"{uri}_{e.ctx.problem.name}", f"{uri}_{e.ctx.problem.name}_{arch}"):
            name = _cpp_name(candidate)
            if name not in taken:
                break
        else:
            n = 2
            while f"{name}_{n}" in taken:
                n += 1
            name = f"{name}_{n}"
        taken.add(name)
        e.name = name
    return out


class LaunchData(TypedDict):
    """One launch of a config: `entry` (a C string literal of the kernel name), `block` (3 ints), `smem_dynamic`
    (bytes), `args` (the kernel's argument names), `grid` (3 `GridDim`: x, y, z)."""

    entry: str
    block: list[int]
    smem_dynamic: int
    args: list[str]
    grid: list[GridDim]


class ConfigData(TypedDict):
    """One exported config.

    `name`: its C++ identifier. For the comment block: `figures` (floats: tbps, tflops, fraction_of_ceiling,
    ceiling_tbps, median_ms), `facts` (registers, smem_bytes, blocks_per_sm as recorded, "?" when not),
    `trial` (its number), `when` (date measured), `note` (grid caveats, may be empty). `launches`: `LaunchData`.
    `init`: the `Config` initializer's values as C++ literals, by field name (uri, study, gpu, arch,
    problem_name, dtype: string literals; problem, params, derived: lists of literals in struct order; threads,
    registers, smem_bytes, spill_bytes, blocks_per_sm: ints; tbps, tflops, fraction_of_ceiling, median_ms:
    double literals; source: a raw string literal, or None when not embedded).
    """

    name: str
    figures: dict[str, float]
    facts: dict[str, Any]
    trial: int
    when: str
    note: str
    launches: list[LaunchData]
    init: dict[str, Any]


def _launch_data(spec: _LaunchSpec) -> LaunchData:
    return LaunchData(
        entry=c_string(spec.entry),
        block=list(spec.block),
        smem_dynamic=spec.smem_dynamic,
        args=list(spec.args),
        grid=spec.grid,
    )


def _config_data(e: _Exported, param_types: dict[str, str], derived_types: dict[str, str]) -> ConfigData:
    a = e.trial.user_attrs
    attrs = e.study.user_attrs
    sizes = e.ctx.problem.sizes
    init = {
        "uri": c_string(str(a.get("uri") or kernel_uri(e.ctx.family, e.params))),
        "study": c_string(str(e.study.study_name)),
        "gpu": c_string(str(attrs.get("gpu") or "")),
        "arch": c_string(str(attrs.get("arch") or "")),
        "problem_name": c_string(str(e.ctx.problem.name)),
        "dtype": c_string(str(e.ctx.problem.dtype)),
        "problem": [str(sizes[s]) for s in sizes],
        "params": [_cpp_value(e.params[n], t) for n, t in param_types.items()],
        "derived": [_cpp_value(e.derived.get(n, 0), t) for n, t in derived_types.items()],
        "threads": max(math.prod(spec.block) for spec in e.launches),
        **{k: int(a.get(k) or 0) for k in ("registers", "smem_bytes", "spill_bytes", "blocks_per_sm")},
        **{k: _cpp_value(a.get(k) or 0.0, "double") for k in ("tbps", "tflops", "fraction_of_ceiling", "median_ms")},
        "source": _raw_string(e.source) if e.source is not None else None,
    }
    figures = {k: float(a.get(k) or 0) for k in ("tbps", "tflops", "fraction_of_ceiling", "ceiling_tbps", "median_ms")}
    return ConfigData(
        name=e.name,
        figures=figures,
        facts={k: a.get(k, "?") for k in ("registers", "smem_bytes", "blocks_per_sm")},
        trial=e.trial.number,
        when=e.trial.datetime_complete.strftime("%Y-%m-%d") if e.trial.datetime_complete else "?",
        note=e.grid_note,
        launches=[_launch_data(spec) for spec in e.launches],
        init=init,
    )


def _study_data(study: optuna.Study, configs: list[ConfigData]) -> dict[str, Any]:
    attrs = study.user_attrs
    problem = attrs.get("problem") or {}
    return {
        "name": study.study_name,
        "gpu": attrs.get("gpu", "?"),
        "arch": attrs.get("arch", "?"),
        "problem_name": problem.get("name", "?"),
        "dtype": problem.get("dtype", ""),
        "sizes": " ".join(f"{k}={v}" for k, v in (problem.get("sizes") or {}).items()),
        "configs": configs,
    }


def header_context(
    studies: Sequence[optuna.Study], pick: str = "fastest", namespace: str = "tuned", with_source: bool = False
) -> dict[str, Any]:
    """What ``export_templates/header.h.j2`` receives: plain data, every C++ literal already spelled.

    - ``kernel`` (the family's name), ``kernel_ns`` (as a C++ identifier), ``namespace``, ``pick``, ``version``
      (tuner's), ``now`` (UTC, minutes), ``gemm_like`` (a TFLOP/s family: the comments quote TFLOP/s too);
    - ``sizes``: the C++ names of the problem sizes, in the family's order;
    - ``params``, ``derived``: ``[{"name", "type"}]`` the members of `Params` and `Derived` (C++ names and types);
    - ``studies``: per study ``{"name", "gpu", "arch", "problem_name", "dtype", "sizes" (text), "configs"}``,
      its configs (`ConfigData`) fastest first;
    - ``configs``: every `ConfigData`, in the order of ``studies``;
    - ``shapes``: each tuned shape once, as text (problem name, sizes, GPU).

    InputError as `write_header`.
    """
    if pick not in ("fastest", "pareto"):
        raise InputError(f"--pick {pick!r}: expected fastest or pareto")
    check_namespace(namespace)
    exported = _exported_configs(studies, pick, with_source)
    kernel = exported[0].ctx.kernel
    param_types = {}
    for name in exported[0].params:
        values = []
        for e in exported:
            dist = e.trial.distributions.get(name)
            values += list(getattr(dist, "choices", ())) or [e.params[name]]
        param_types[name] = _cpp_type(values)
    derived_names = list(dict.fromkeys(k for e in exported for k in e.derived))
    derived_types = {n: _cpp_type(e.derived[n] for e in exported if n in e.derived) for n in derived_names}
    configs = [_config_data(e, param_types, derived_types) for e in exported]
    per_study = [
        _study_data(study, [c for c, e in zip(configs, exported, strict=True) if e.study is study]) for study in studies
    ]
    from tuner.core.shipped import VERSION

    return {
        "kernel": kernel,
        "kernel_ns": _cpp_name(kernel),
        "namespace": namespace,
        "pick": pick,
        "version": VERSION,
        "now": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gemm_like": any(throughput_unit(e.study) == "TFLOP/s" for e in exported),
        "sizes": [_cpp_name(s) for s in exported[0].ctx.problem.sizes],
        "params": [{"name": _cpp_name(n), "type": t} for n, t in param_types.items()],
        "derived": [{"name": _cpp_name(n), "type": t} for n, t in derived_types.items()],
        "studies": per_study,
        "configs": configs,
        # each tuned shape once, in the studies' order
        "shapes": list(dict.fromkeys(f"{d['problem_name']} ({d['sizes']}, {d['gpu']})" for d in per_study)),
    }


#: The header's template: package data next to the kernel templates' directory, not in it (it is no kernel).
EXPORT_TEMPLATES_DIR = resources.files("tuner.results") / "export_templates"
HEADER_TEMPLATE = "header.h.j2"


@functools.cache
def _header_template() -> jinja2.Template:
    return environment(str(EXPORT_TEMPLATES_DIR)).get_template(HEADER_TEMPLATE)


def header_text(
    studies: optuna.Study | Sequence[optuna.Study],
    pick: str = "fastest",
    namespace: str = "tuned",
    with_source: bool = False,
) -> str:
    """The text `write_header` writes (see there): `header_context` rendered by the strict template environment
    of `tuner.build.render`."""
    if isinstance(studies, optuna.Study):
        studies = [studies]
    return _header_template().render(header_context(studies, pick, namespace, with_source))


def write_header(
    studies: optuna.Study | Sequence[optuna.Study],
    path: str | Path,
    pick: str = "fastest",
    namespace: str = "tuned",
    with_source: bool = False,
) -> Path:
    """Write a self-contained C++17 header of the tuned configs of one or more studies of one kernel.

    Layout: ``#pragma once``; a comment block (per study: name, GPU, arch, problem; per config: TB/s — and
    TFLOP/s for TFLOP/s families — fraction of the copy ceiling, median time, registers, SMEM, trial number and
    date); then ``namespace <namespace>::<kernel>`` with one `Config` type and one ``inline constexpr Config``
    per exported trial (named by its uri; + problem/arch when two would clash) holding every param, the derived
    values, threads per block, registers, SMEM, its launches (entry, block, dynamic SMEM) and a constexpr
    ``grid(sizes...)`` formula; ``configs[]``; and ``select(sizes..., arch = nullptr)``, the config tuned for
    the nearest problem (on that arch). `pick`: "fastest" (one config per study) or "pareto" (its Pareto front,
    fastest first). `with_source` embeds each config's rendered CUDA as a raw string literal.

    InputError — before anything is written — for a namespace that is not a C++ identifier, an unknown `pick`,
    an unwritable path, studies with nothing measured or of different kernels, or (with sources) a space file
    that is gone or changed since the study ran.
    """
    check_namespace(namespace)
    if pick not in ("fastest", "pareto"):
        raise InputError(f"--pick {pick!r}: expected fastest or pareto")
    path = check_writable(path, None, "--header")
    return atomic_write(path, header_text(studies, pick, namespace, with_source))

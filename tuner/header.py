"""The C++17 header of tuned configs (`tuner export`): one `Config` per exported trial, grid formulas in the
problem sizes, and a constexpr `select` by shape. InputError for a namespace that is not a C++ identifier.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from tuner.errors import InputError
from tuner.expr import ceil_div
from tuner.files import atomic_write, check_writable
from tuner.studies import (
    StudyContext,
    _first_line,
    best_trial,
    pareto_trials,
    render_trial,
    study_context,
    throughput_unit,
)
from tuner.studies import derived as recorded_derived

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
    """A C++ namespace name: an identifier, or identifiers joined by ``::``, none a keyword. Else InputError."""
    parts = namespace.split("::")
    for part in parts:
        if not _IDENT.match(part) or part in CPP_KEYWORDS or "__" in part:
            raise InputError(
                f"--namespace {namespace!r}: not a C++ identifier (letters, digits, _, not a keyword; nested with ::)"
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


@dataclass
class _LaunchSpec:
    entry: str
    block: tuple[int, int, int]
    smem_dynamic: int
    args: tuple[str, ...]
    grid: list[str]  # three C++ expressions over `p`
    grid_text: list[str]  # the same, readable


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


def _fit_dim(values: list[tuple[dict[str, int], int]], sizes: list[str]) -> tuple[str, str] | None:
    """A formula g = c or g = ceil_div(product of some sizes, q) that reproduces every (sizes, g) probe; as
    (C++ expression over `p`, readable text). None when none fits."""
    base_sizes, g0 = values[0]
    if all(g == g0 for _, g in values):
        return f"{g0}u", str(g0)
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
                operand = " * ".join(f"p.{_cpp_name(s)}" for s in subset)
                readable = " * ".join(subset)
                if q == 1:
                    return f"static_cast<unsigned>({operand})", readable
                return f"static_cast<unsigned>(ceil_div({operand}, {q}))", f"ceil({readable} / {q})"
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
    from tuner import space as space_mod

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
            f"trial {trial.number}: {family.name}.launches() fails on the tuned problem: {_first_line(exc)}"
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
        grid, text = [], []
        for d in range(3):
            fit = _fit_dim([(sz, ls[i].grid[d]) for sz, ls in probes], sizes)
            if fit is None:
                fit = (f"{launch.grid[d]}u", f"{launch.grid[d]} (tuned problem only)")
                notes.append(f"launch {i} grid.{'xyz'[d]}: no ceil_div formula fits; tuned problem only")
            grid.append(fit[0])
            text.append(fit[1])
        specs.append(
            _LaunchSpec(
                entry=launch.entry,
                block=tuple(launch.block),
                smem_dynamic=launch.smem_dynamic,
                args=tuple(launch.args),
                grid=grid,
                grid_text=text,
            )
        )
    return specs, "; ".join(notes)


def _exported_configs(studies: Sequence[optuna.Study], pick: str, with_source: bool) -> list[_Exported]:
    out: list[_Exported] = []
    for study in studies:
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
            entry = source.entry if source is not None else str(t.user_attrs.get("uri") or "")
            if not entry:
                from tuner.render import uri

                entry = uri(ctx.family, params)
            launches, note = _launch_specs(ctx, t, params, derived, entry)
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
        uri = str(e.trial.user_attrs.get("uri") or e.launches[0].entry)
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


def header_text(
    studies: optuna.Study | Sequence[optuna.Study],
    pick: str = "fastest",
    namespace: str = "tuned",
    with_source: bool = False,
) -> str:
    """The text `write_header` writes (see there)."""
    if isinstance(studies, optuna.Study):
        studies = [studies]
    if pick not in ("fastest", "pareto"):
        raise InputError(f"--pick {pick!r}: expected fastest or pareto")
    check_namespace(namespace)
    configs = _exported_configs(studies, pick, with_source)
    kernel = configs[0].ctx.kernel
    sizes = list(configs[0].ctx.problem.sizes)
    size_names = [_cpp_name(s) for s in sizes]
    param_names = list(configs[0].params)
    derived_names = list(dict.fromkeys(k for e in configs for k in e.derived))
    param_types = {}
    for name in param_names:
        values = []
        for e in configs:
            dist = e.trial.distributions.get(name)
            values += list(getattr(dist, "choices", ())) or [e.params[name]]
        param_types[name] = _cpp_type(values)
    derived_types = {n: _cpp_type(e.derived[n] for e in configs if n in e.derived) for n in derived_names}
    gemm_like = any(throughput_unit(e.study) == "TFLOP/s" for e in configs)
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    from tuner import __version__

    lines: list[str] = ["#pragma once", "//"]
    lines.append(f"// {kernel}: tuned configs (pick: {pick}) exported by `tuner export` (tuner {__version__})")
    lines.append(f"// on {now}. Generated: do not edit.")
    lines.append("// Figures are medians measured by the study on the GPU named; fractions are of the")
    lines.append("// device-to-device copy bandwidth measured on that GPU with the same protocol.")
    for study in studies:
        attrs = study.user_attrs
        problem = attrs.get("problem") or {}
        size_text = " ".join(f"{k}={v}" for k, v in (problem.get("sizes") or {}).items())
        lines.append("//")
        lines.append(
            f"// study {study.study_name}: {attrs.get('gpu', '?')} ({attrs.get('arch', '?')}), "
            f"problem {problem.get('name', '?')} {problem.get('dtype', '')} {size_text}"
        )
        for e in (c for c in configs if c.study is study):
            a = e.trial.user_attrs
            when = e.trial.datetime_complete.strftime("%Y-%m-%d") if e.trial.datetime_complete else "?"
            tput = f"{float(a.get('tbps') or 0):.3f} TB/s"
            if gemm_like:
                tput += f", {float(a.get('tflops') or 0):.2f} TFLOP/s"
            fraction = float(a.get("fraction_of_ceiling") or 0)
            ceiling = float(a.get("ceiling_tbps") or 0)
            lines.append(
                f"//   {e.name}: {tput} = {fraction:.3f} of the {ceiling:.2f} TB/s ceiling, "
                f"median {float(a.get('median_ms') or 0):.4g} ms;"
            )
            lines.append(
                f"//     {a.get('registers', '?')} registers, {a.get('smem_bytes', '?')} B SMEM, "
                f"{a.get('blocks_per_sm', '?')} blocks/SM; trial {e.trial.number}, measured {when}"
            )
            if e.grid_note:
                lines.append(f"//     note: {e.grid_note}")
    lines += [
        "//",
        "// Grid formulas come from tuner.kernels launches(), evaluated on each tuned problem and on each",
        "// size x2 and x3. `select` returns the config tuned for the problem nearest in log space (exact",
        "// match first). A config's source (when embedded) has its tuned problem's sizes compiled in:",
        "// check with `tuned_for` before launching it on another shape.",
        "",
        f"namespace {namespace}::{_cpp_name(kernel)} {{",
        "",
        "struct Dim3 {",
        "    unsigned x, y, z;",
        "#if defined(__CUDACC__)",
        "    operator dim3() const { return dim3(x, y, z); }",
        "#endif",
        "};",
        "",
        "constexpr long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }",
        "",
        "// Problem sizes, in the family's order.",
        "struct Problem {",
        *[f"    long long {n};" for n in size_names],
        "};",
        "",
        "// The tuned knobs (the study's params).",
        "struct Params {",
        *[f"    {param_types[n]} {_cpp_name(n)};" for n in param_names],
        "};",
        "",
        "// Values derived from the params (and the tuned problem) by the search space.",
        "struct Derived {",
        *[f"    {derived_types[n]} {_cpp_name(n)};" for n in derived_names],
        "};",
        "",
        "struct Launch {",
        '    const char* entry;            // extern "C" kernel name in the source',
        "    Dim3 block;",
        "    unsigned smem_dynamic_bytes;",
        "};",
        "",
        "struct Config {",
        "    const char* uri;              // readable name: the same in logs, caches and the dashboard",
        "    const char* study;",
        "    const char* gpu;              // the GPU it was measured on",
        '    const char* arch;             // e.g. "sm_90"',
        "    const char* problem_name;",
        "    const char* dtype;",
        "    Problem problem;              // the sizes it was tuned for (and its source compiled for)",
        "    Params params;",
        "    Derived derived;",
        "    int threads;                  // threads per block (largest over its launches)",
        "    int registers;                // per thread",
        "    int smem_bytes;               // per block, static + dynamic",
        "    int spill_bytes;",
        "    int blocks_per_sm;            // resident blocks per SM (occupancy) as measured",
        "    double tbps;                  // measured useful bandwidth",
        "    double tflops;",
        "    double fraction_of_ceiling;   // of the device-to-device copy bandwidth on that GPU",
        "    double median_ms;",
        "    int launch_count;",
        "    const Launch* launches;",
        "    Dim3 (*grid_fn)(const Problem& p, int launch);",
        "    const char* source;           // rendered CUDA (nullptr unless exported --with-source)",
        "",
        "    constexpr Dim3 grid(const Problem& p, int launch = 0) const { return grid_fn(p, launch); }",
        f"    constexpr Dim3 grid({', '.join(f'long long {n}' for n in size_names)}, int launch = 0) const {{",
        f"        return grid_fn(Problem{{{', '.join(size_names)}}}, launch);",
        "    }",
        f"    constexpr bool tuned_for({', '.join(f'long long {n}' for n in size_names)}) const {{",
        f"        return {' && '.join(f'problem.{n} == {n}' for n in size_names)};",
        "    }",
        "};",
        "",
    ]
    for e in configs:
        a = e.trial.user_attrs
        attrs = e.study.user_attrs
        threads = max(math.prod(spec.block) for spec in e.launches)
        lines.append(f"// {e.name}")
        lines.append(f"inline constexpr Launch {e.name}_launches[] = {{")
        for spec in e.launches:
            block = ", ".join(f"{b}u" for b in spec.block)
            lines.append(
                f"    {{{c_string(spec.entry)}, {{{block}}}, {spec.smem_dynamic}u}},  // args: {', '.join(spec.args)}"
            )
        lines.append("};")
        lines.append(f"constexpr Dim3 {e.name}_grid(const Problem& p, int launch) {{")
        for i, spec in enumerate(e.launches):
            lines.append(f"    // launch {i}: grid ({', '.join(spec.grid_text)})")
            lines.append(f"    if (launch == {i}) {{")
            lines.append("        return Dim3{" + (",\n                    ".join(spec.grid)) + "};")
            lines.append("    }")
        lines.append("    (void)p;")
        lines.append("    return Dim3{0u, 0u, 0u};")
        lines.append("}")
        problem_init = ", ".join(str(e.ctx.problem.sizes[s]) for s in sizes)
        params_init = ", ".join(_cpp_value(e.params[n], param_types[n]) for n in param_names)
        derived_init = ", ".join(_cpp_value(e.derived.get(n, 0), derived_types[n]) for n in derived_names)
        fields = [
            (c_string(str(str(a.get("uri") or e.launches[0].entry))), "uri"),
            (c_string(str(e.study.study_name)), "study"),
            (c_string(str(str(attrs.get("gpu") or ""))), "gpu"),
            (c_string(str(str(attrs.get("arch") or ""))), "arch"),
            (c_string(str(e.ctx.problem.name)), "problem_name"),
            (c_string(str(e.ctx.problem.dtype)), "dtype"),
            (f"Problem{{{problem_init}}}", "problem"),
            (f"Params{{{params_init}}}", "params"),
            (f"Derived{{{derived_init}}}", "derived"),
            (str(threads), "threads"),
            (str(int(a.get("registers") or 0)), "registers"),
            (str(int(a.get("smem_bytes") or 0)), "smem_bytes"),
            (str(int(a.get("spill_bytes") or 0)), "spill_bytes"),
            (str(int(a.get("blocks_per_sm") or 0)), "blocks_per_sm"),
            (_cpp_value(a.get("tbps") or 0.0, "double"), "tbps"),
            (_cpp_value(a.get("tflops") or 0.0, "double"), "tflops"),
            (_cpp_value(a.get("fraction_of_ceiling") or 0.0, "double"), "fraction_of_ceiling"),
            (_cpp_value(a.get("median_ms") or 0.0, "double"), "median_ms"),
            (str(len(e.launches)), "launch_count"),
            (f"{e.name}_launches", "launches"),
            (f"&{e.name}_grid", "grid_fn"),
            (_raw_string(e.source) if e.source is not None else "nullptr", "source"),
        ]
        lines.append(f"inline constexpr Config {e.name} = {{")
        for value, name in fields:
            if name == "source" and e.source is not None:
                lines.append(f"    /* source */ {value},")
            else:
                lines.append(f"    {value},  // {name}")
        lines.append("};")
        lines.append("")
    lines += [
        "// Every exported config; for each study, fastest first.",
        "inline constexpr const Config* configs[] = {",
        *[f"    &{e.name}," for e in configs],
        "};",
        f"inline constexpr int config_count = {len(configs)};",
        "",
        "constexpr bool same_text(const char* a, const char* b) {",
        "    while (*a != '\\0' && *a == *b) { ++a; ++b; }",
        "    return *a == *b;",
        "}",
        "",
        "constexpr double ratio(long long a, long long b) {",
        "    return a <= 0 || b <= 0 ? 1e300 : a > b ? double(a) / double(b) : double(b) / double(a);",
        "}",
        "",
        "// Distance of two problems in log space: the product of the max/min ratios of their sizes",
        "// (1.0: the same problem).",
        "constexpr double distance(const Problem& a, const Problem& b) {",
        "    return " + " * ".join(f"ratio(a.{n}, b.{n})" for n in size_names) + ";",
        "}",
        "",
        "// The config tuned for the problem nearest to the given sizes (an exact match wins; ties go to the",
        '// earlier, i.e. faster, config) among those tuned on `arch` (e.g. "sm_90"), or on any arch when',
        "// arch is nullptr. nullptr only when no config was tuned on that arch.",
        f"constexpr const Config* select({', '.join(f'long long {n}' for n in size_names)}, "
        "const char* arch = nullptr) {",
        f"    const Problem want{{{', '.join(size_names)}}};",
        "    const Config* best = nullptr;",
        "    double best_distance = 0.0;",
        "    for (const Config* c : configs) {",
        "        if (arch != nullptr && !same_text(c->arch, arch)) continue;",
        "        const double d = distance(c->problem, want);",
        "        if (best == nullptr || d < best_distance) { best = c; best_distance = d; }",
        "    }",
        "    return best;",
        "}",
        "",
        f"}}  // namespace {namespace}::{_cpp_name(kernel)}",
        "",
    ]
    return "\n".join(lines)


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

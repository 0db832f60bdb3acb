"""Reading a space file: YAML parsed once with its line numbers, and each top-level key checked into its value.

Every fault is a `SpaceError` naming the file and the line of the key at fault (`fail(message, *keys)`, built by
`tuner.space.space.load`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tuner.core.errors import SpaceError
from tuner.expr import Expr, ExprError
from tuner.kernels.plain import C_IDENTIFIER, C_IDENTIFIER_RULE

if TYPE_CHECKING:
    pass
from tuner.space.problem import Direction, Objective, Problem

METRICS = (
    "throughput",
    "tbps",
    "tflops",
    "time_ms",
    "fraction_of_ceiling",
    "registers",
    "smem_bytes",
    "spill_bytes",
)
DEFAULT_OBJECTIVES: tuple[tuple[str, Direction], ...] = (
    ("throughput", "maximize"),
    ("registers", "minimize"),
    ("smem_bytes", "minimize"),
)
#: what a name and a string value must look like (a C identifier): a name reaches CUDA, a string value selects a
#: variant in a template and is never pasted into CUDA as text
IDENTIFIER = C_IDENTIFIER
MAX_RANGE = 10**6
MAX_FILE_BYTES = 1 << 20
MAX_PROBLEM_SIZE = 2**63 - 1


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """SafeLoader that refuses a mapping key given twice (PyYAML keeps the last one silently). It parses with
    libyaml where PyYAML was built with it (the wheels are): `tuner spaces` reads every shipped space."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if first != key_node.start_mark.line + 1:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key!r} appears twice (lines {first} and {key_node.start_mark.line + 1})",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep)


class _LineFinder:
    """Maps key paths to 1-based line numbers using the YAML node tree."""

    def __init__(self, root: yaml.Node | None):
        self.root = root

    def line(self, *keys: Any) -> int | None:
        node, best = self.root, None
        for key in keys:
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if k.value == str(key):
                        best, node = k.start_mark.line + 1, v
                        break
                else:
                    return best
            elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
                node = node.value[key]
                best = node.start_mark.line + 1
            else:
                return best
        return best


def _load_problems(spec: Any, family, fail) -> list[Problem]:
    items = spec if isinstance(spec, list) else [spec]
    if not items:
        raise fail("'problem' must name at least one problem", "problem")
    problems = []
    for i, item in enumerate(items):
        keys = ("problem", i) if isinstance(spec, list) else ("problem",)
        if not isinstance(item, dict):
            raise fail("a problem is a mapping of name, dtype and integer sizes", *keys)
        item = dict(item)
        name = str(item.pop("name", f"problem{i}"))
        dtype = item.pop("dtype", "float32")
        if dtype not in family.dtypes:
            raise fail(
                f"dtype {dtype!r} is not supported by {family.name} (supported: {', '.join(family.dtypes)})",
                *keys,
                "dtype",
            )
        for key, value in item.items():
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_PROBLEM_SIZE:
                raise fail(f"problem size {key!r} must be a positive 64-bit integer, got {value!r}", *keys, key)
        missing = [s for s in family.problem_sizes if s not in item]
        if missing:
            raise fail(f"problem {name!r} lacks sizes {missing} that {family.name} needs", *keys)
        fault = family.problem_fault({**item, "dtype": dtype})
        if fault is not None:
            raise fail(f"problem {name!r}: {fault}", *keys)
        problems.append(Problem(name=name, dtype=dtype, sizes=item))
    return problems


def _load_params(spec: Any, fail) -> dict[str, tuple[Any, ...]]:
    if not isinstance(spec, dict) or not spec:
        raise fail("'params' must be a non-empty mapping of name: values", "params")
    params: dict[str, tuple[Any, ...]] = {}
    for name, values in spec.items():
        if not isinstance(name, str) or not IDENTIFIER.fullmatch(name) or name.startswith("__"):
            raise fail(f"parameter name {name!r} is not a C identifier ({C_IDENTIFIER_RULE})", "params", name)
        if isinstance(values, dict):
            values = _expand_range(name, values, fail)
        if not isinstance(values, list):
            raise fail(f"parameter {name!r}: expected a list of values or {{pow2: [lo, hi]}}", "params", name)
        if not values:
            raise fail(f"parameter {name!r} has no values", "params", name)
        for v in values:
            if isinstance(v, dict | list) or v is None:
                raise fail(f"parameter {name!r}: value {v!r} is not a scalar", "params", name)
            if isinstance(v, str) and not IDENTIFIER.fullmatch(v):
                raise fail(
                    f"parameter {name!r}: string value {v!r} is not an identifier ([A-Za-z_][A-Za-z0-9_]*); "
                    f"string values name a variant and are never pasted into CUDA",
                    "params",
                    name,
                )
        if len(set(values)) != len(values):
            raise fail(f"parameter {name!r} lists a value twice", "params", name)
        params[name] = tuple(values)
    return params


def _expand_range(name: str, spec: dict, fail) -> list[Any]:
    if "values" in spec and len(spec) == 1:
        return spec["values"]
    if "pow2" in spec and len(spec) == 1:
        lo_hi = spec["pow2"]
        if (
            not isinstance(lo_hi, list)
            or len(lo_hi) != 2
            or not all(isinstance(x, int) and x > 0 for x in lo_hi)
            or any(x & (x - 1) for x in lo_hi)
            or lo_hi[0] > lo_hi[1]
        ):
            raise fail(f"parameter {name!r}: pow2 expects [lo, hi], powers of two with lo <= hi", "params", name)
        lo, hi = lo_hi
        if hi.bit_length() > 64:
            raise fail(f"parameter {name!r}: pow2 values above 2**63 are not allowed", "params", name)
        return [1 << k for k in range(lo.bit_length() - 1, hi.bit_length())]
    if "range" in spec and len(spec) == 1:
        r = spec["range"]
        if not isinstance(r, list) or len(r) not in (2, 3) or not all(isinstance(x, int) for x in r):
            raise fail(f"parameter {name!r}: range expects [lo, hi] or [lo, hi, step] (inclusive)", "params", name)
        lo, hi, step = (r + [1])[:3]
        if step <= 0:
            raise fail(f"parameter {name!r}: range step must be positive", "params", name)
        if len(range(lo, hi + 1, step)) > MAX_RANGE:
            raise fail(
                f"parameter {name!r}: range of {len(range(lo, hi + 1, step)):,} values is above the limit "
                f"of {MAX_RANGE:,}",
                "params",
                name,
            )
        return list(range(lo, hi + 1, step))
    raise fail(
        f"parameter {name!r}: expected one of {{values: [...]}}, {{pow2: [lo, hi]}}, {{range: [lo, hi]}}",
        "params",
        name,
    )


def _load_exprs(spec: Any, key: str, fail) -> dict[str, Expr] | list[Expr] | Any:
    """A mapping of name: expression, or a list of expressions, parsed; anything else is returned as given for
    the caller to refuse in its own words."""
    if isinstance(spec, dict):
        named: dict[str, Expr] = {}
        for name, text in spec.items():
            if not isinstance(name, str) or not IDENTIFIER.fullmatch(name):
                raise fail(f"{key}: name {name!r} is not a C identifier ({C_IDENTIFIER_RULE})", key, name)
            try:
                named[name] = Expr.parse(text)
            except ExprError as exc:
                raise fail(f"{key} {name!r}: {exc}", key, name) from None
        return named
    if isinstance(spec, list):
        listed: list[Expr] = []
        for i, text in enumerate(spec):
            try:
                listed.append(Expr.parse(text))
            except ExprError as exc:
                raise fail(f"{key}: {exc}", key, i) from None
        return listed
    return spec


def constraint_list(spec: Any) -> Any:
    """``constraints:`` (or a Kernel Tuner cache's ``restrictions``) as a list: Kernel Tuner's restrictions are
    Python-expression strings, a list of them or one, and read as our expressions as they are written
    (``block_size_x*tile_size_x <= 1024``, with ``and``/``or``). Anything else is returned for the caller to refuse."""
    if not spec:  # absent, empty or null, as before Kernel Tuner's form
        return []
    return [spec] if isinstance(spec, str) else spec


def _load_objectives(spec: Any, fail) -> list[Objective]:
    if spec is None:
        return [Objective(n, d) for n, d in DEFAULT_OBJECTIVES]
    if not isinstance(spec, list) or not spec:
        raise fail("'objectives' must be a non-empty list of {metric: maximize|minimize}", "objectives")
    out = []
    for i, item in enumerate(spec):
        if not isinstance(item, dict) or len(item) != 1:
            raise fail("each objective is {metric: maximize|minimize}", "objectives", i)
        ((name, direction),) = item.items()
        if name not in METRICS:
            raise fail(f"unknown objective metric {name!r} (known: {', '.join(METRICS)})", "objectives", i)
        if direction not in ("maximize", "minimize"):
            raise fail(f"objective {name!r}: direction must be maximize or minimize", "objectives", i)
        out.append(Objective(name, direction))
    return out


def read_document(path: Path) -> tuple[str, Any, _LineFinder]:
    """The text of the space file at `path`, its YAML data and the line finder of its keys: one parse, so the node
    tree gives the line numbers and the data is constructed from the same tree. SpaceError for a file that cannot
    be read, is larger than `MAX_FILE_BYTES`, is not UTF-8 or is not YAML."""
    where = str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpaceError("no such space file", where) from None
    except OSError as exc:
        raise SpaceError(f"cannot read: {exc.strerror}", where) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpaceError(f"larger than {MAX_FILE_BYTES >> 20} MiB: not a space file", where)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpaceError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x}): not a space file", where, line) from None
    try:
        loader = _Loader(text)
        try:
            root = loader.get_single_node()
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpaceError(f"malformed YAML: {problem}", where, mark.line + 1 if mark else None) from None
    except RecursionError:
        raise SpaceError("malformed YAML: nested too deeply", where) from None
    return text, data, _LineFinder(root)

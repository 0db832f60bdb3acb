"""Hostile and careless inputs: each ends in one line on stderr and exit code 2 (or a valid
result), never a traceback, and leaves every file it was given as it was, with no new file beside it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner import kernels
from tuner.build.render import render
from tuner.cli import main as cli
from tuner.core.errors import InputError, SpaceError, TemplateError
from tuner.space import space as space_mod
from tuner.space.reading import IDENTIFIER

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"
DATA = ROOT / "tests" / "data"
EXAMPLES = ROOT / "examples" / "kt_kernel"
STENCIL = (EXAMPLES / "stencil2d.yaml").read_text()

COPY_HEAD = """kernel: copy
problem: {name: n, n: 1048576, span: 32, dtype: float32}
"""
COPY_PARAMS = """params:
  stride: [1, 2]
  vec: [1, 2, 4]
  block: [128, 256]
  items: [1, 2]
derived:
  per_block: block * items * vec
  grid: n // per_block
"""
# 6 params of 1000 values, no valid config: 10^18 Cartesian points.
HUGE = (
    COPY_HEAD
    + """params:
  stride: [1]
  vec: [1]
  block: [256]
  items: [1]
  a: {range: [1, 1000]}
  b: {range: [1, 1000]}
  c: {range: [1, 1000]}
  d: {range: [1, 1000]}
  e: {range: [1, 1000]}
  f: {range: [1, 1000]}
derived:
  per_block: block * items * vec
  grid: n // per_block
"""
)


def copy_space(constraints: str = "", params: str = COPY_PARAMS) -> str:
    return COPY_HEAD + params + (f"constraints:\n  - {constraints}\n" if constraints else "")


def optuna_db(path: Path, params: dict) -> None:
    """A small Optuna database with one completed trial of `params` (another kernel's recording)."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    study = optuna.create_study(storage=f"sqlite:///{path}", study_name="other")
    study.add_trial(
        optuna.trial.create_trial(
            params=params, distributions={k: CategoricalDistribution([v]) for k, v in params.items()}, value=1.0
        )
    )


def foreign_db(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO accounts VALUES (1, 'x')")
    conn.commit()
    conn.close()


#: a gzip header over a deflate stream that is not one: gzip raises zlib's own error for it
CORRUPT_GZIP = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage, not deflate"

STUDY = ("study", "transpose", "--trials", "3")
REPLAY = (*STUDY, "--replay", str(RECORDING))

# (id, argv ({d} is the case's folder), files to create: name → text | callable(path), fragment of the message;
# None = a valid result, exit 0)
CASES = [
    (
        "newline-in-string-value",
        ("render", "{d}/s.yaml"),
        {
            "s.yaml": copy_space(
                params=COPY_PARAMS.replace(
                    "items: [1, 2]\n",
                    'items: [1, 2]\n  hint: ["a\\nextern \\"C\\" __global__ void evil(int* p){ *p = 1; }"]\n',
                )
            )
        },
        "is not an identifier",
    ),
    (
        "power-tower-constant",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space("9**9**9**9 > 0")},
        "exponent 387420489 is above the limit",
    ),
    ("power-tower-param", ("check", "{d}/s.yaml"), {"s.yaml": copy_space("stride**9**9**9 > 0")}, "exponent"),
    (
        "huge-unsatisfiable-render",
        ("render", "{d}/s.yaml"),
        {"s.yaml": HUGE + "constraints:\n  - a + f < 0\n"},
        "no valid config for problem 'n' found among",
    ),
    (
        "huge-unsatisfiable-check",
        ("check", "{d}/s.yaml", "--sample", "5"),
        {"s.yaml": HUGE + "constraints:\n  - a + f < 0\n"},
        "no valid config",
    ),
    (
        "huge-sample-is-drawn-not-listed",
        ("check", "{d}/s.yaml", "--sample", "3", "--json"),
        {"s.yaml": HUGE + "constraints:\n  - f > 500\n"},
        None,
    ),
    ("non-utf8-space", ("render", "{d}/s.yaml"), {"s.yaml": b"kernel: copy\n\xff\xfe\n"}, "not UTF-8"),
    ("database-as-space", ("render", "{d}/x.db"), {"x.db": lambda p: foreign_db(p)}, "not UTF-8"),
    (
        "plus-chain-20000",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space("+".join(["stride"] * 20000) + " > 0")},
        "longer than the limit",
    ),
    (
        "unary-minus-5000",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space("-" * 3000 + "stride < 0")},
        "nests too deeply",
    ),
    ("not-5000", ("render", "{d}/s.yaml"), {"s.yaml": copy_space("not " * 1000 + "stride")}, "levels deep"),
    (
        "range-1e15",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space(params=COPY_PARAMS.replace("items: [1, 2]", "items: {range: [0, 1000000000000000]}"))},
        "above the limit of 1,000,000",
    ),
    (
        "string-repeat-1e13",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space("\"'x' * 10**13 != ''\"")},
        "longer than 4096",
    ),
    (
        "string-format",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space("\"'%999999999d' % stride != ''\"")},
        "string formatting",
    ),
    ("set-unclosed-list", ("render", "copy", "--set", "stride=[1"), {}, "not a YAML scalar"),
    ("set-jinja-braces", ("render", "copy", "--set", "stride={{{{ 7*7 }}}}"), {}, "not a YAML scalar"),
    ("set-outside-space", ("render", "copy", "--set", "stride=3"), {}, "outside the space"),
    (
        "string-param-in-template-arithmetic",
        ("render", "{d}/t.yaml"),
        {
            "t.yaml": """kernel: transpose
problem: {name: n, rows: 1024, cols: 1024, dtype: float32}
params: {tile: [32], rows_per_thread: [4], pad: [one], vec: [1]}
derived: {threads: (tile // vec) * (tile // rows_per_thread), tile_bytes: tile * 4}
"""
        },
        "transpose.cu.j2:28: cannot render",
    ),
    ("replay-delay-negative", (*REPLAY, "--replay-delay", "-1"), {}, "--replay-delay"),
    ("replay-delay-nan", (*REPLAY, "--replay-delay", "nan"), {}, "--replay-delay"),
    ("screen-cutoff-below-1", (*REPLAY, "--screen-cutoff", "0.9"), {}, "--screen-cutoff"),
    ("screen-cutoff-word", (*REPLAY, "--screen-cutoff", "fast"), {}, "--screen-cutoff"),
    (
        "screen-cutoff-zero",
        (*REPLAY, "--screen-cutoff", "0"),
        {},
        "--screen-cutoff: must be above 1 or off (at 1 or below even a new best would be cut), got 0",
    ),
    (
        "screen-cutoff-half",
        (*REPLAY, "--screen-cutoff", "0.5"),
        {},
        "--screen-cutoff: must be above 1 or off (at 1 or below even a new best would be cut), got 0.5",
    ),
    ("storage-in-memory", (*REPLAY, "--storage", "sqlite://"), {}, "in-memory"),
    ("storage-in-memory-named", (*REPLAY, "--storage", "sqlite:///:memory:"), {}, "in-memory"),
    ("check-arch-bogus", ("check", "copy", "--sample", "1", "--arch", "sm_bogus"), {}, "--arch sm_bogus"),
    ("check-arch-unsupported", ("check", "copy", "--sample", "1", "--arch", "sm_12"), {}, "NVRTC cannot"),
    ("replay-gpus-999", (*REPLAY, "--gpus", "999"), {}, "--gpus 999"),
    ("gpus-without-gpu", (*STUDY, "--gpus", "2"), {}, "GPU"),
    ("main-job-without-gpu", STUDY, {}, "the local engine runs on this machine's GPUs, and it has none"),
    ("unreachable-ray", (*STUDY, "--ray-address", "127.0.0.1:1"), {}, "--ray-address 127.0.0.1:1"),
    ("storage-unknown-dialect", (*REPLAY, "--storage", "notadb://x"), {}, "cannot open"),
    (
        "duplicate-key",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space().replace("  vec: [1, 2, 4]\n", "  vec: [1, 2, 4]\n  stride: [1]\n")},
        "key 'stride' appears twice (lines 4 and 6)",
    ),
    (
        "duplicate-top-key",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space() + "kernel: copy\n"},
        "key 'kernel' appears twice",
    ),
    (
        "division-by-zero",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space("stride // 0 > 0")},
        "evaluating 'stride // 0 > 0' fails: integer division or modulo by zero",
    ),
    ("f-string", ("render", "{d}/s.yaml"), {"s.yaml": copy_space("f'{stride}' == '1'")}, "f-strings are not allowed"),
    (
        "derived-cycle",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space().replace("derived:\n", "derived:\n  a: b + 1\n  b: a + 1\n")},
        "cycle: a → b → a",
    ),
    (
        "string-constant-shadowing-dtype",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space().replace("derived:\n", "derived:\n  dtype: \"'float; evil'\"\n")},
        "name of a problem symbol",
    ),
    (
        "replay-empty-sqlite",
        (*STUDY, "--replay", "{d}/empty.db"),
        {"empty.db": lambda p: sqlite3.connect(p).close()},
        "cannot read as a study database",
    ),
    ("replay-zero-byte-file", (*STUDY, "--replay", "{d}/zero.db"), {"zero.db": ""}, "cannot read as a study database"),
    (
        "replay-foreign-sqlite",
        (*STUDY, "--replay", "{d}/f.db"),
        {"f.db": foreign_db},
        "cannot read as a study database",
    ),
    (
        "replay-other-kernel",
        (*STUDY, "--replay", "{d}/o.db"),
        {"o.db": lambda p: optuna_db(p, {"x": 1})},
        "holds none of the space's configs",
    ),
    (
        "storage-foreign-sqlite",
        (*REPLAY, "--storage", "sqlite:///{d}/f.db"),
        {"f.db": foreign_db},
        "refusing to add Optuna's tables",
    ),
    ("storage-directory", (*REPLAY, "--storage", "sqlite:///{d}"), {}, "is a directory"),
    ("storage-directory-path", (*REPLAY, "--storage", "{d}"), {}, "is a directory"),
    ("storage-empty", (*REPLAY, "--storage", ""), {}, "--storage '': names no database"),
    ("storage-uncreatable", (*REPLAY, "--storage", "sqlite:////proc/x.db"), {}, "/proc/x.db: cannot create"),
    ("storage-uncreatable-path", (*REPLAY, "--storage", "/proc/x.db"), {}, "folder /proc cannot be written"),
    ("storage-missing-folder", (*REPLAY, "--storage", "{d}/typo/x.db"), {}, "folder {d}/typo does not exist"),
    (
        "storage-missing-folder-url",
        (*REPLAY, "--storage", "sqlite:///{d}/typo/x.db"),
        {},
        "folder {d}/typo does not exist",
    ),
    ("storage-not-a-url", (*REPLAY, "--storage", "not a url"), {}, "--storage 'not a url': not a database file's name"),
    ("storage-one-slash", (*REPLAY, "--storage", "sqlite:/x.db"), {}, "--storage sqlite:/x.db: not a URL"),
    ("storage-no-slash", (*REPLAY, "--storage", "sqlite:x.db"), {}, "give a SQLAlchemy URL (DIALECT://..."),
    ("storage-other-suffix", (*REPLAY, "--storage", "{d}/x.txt"), {}, "or a path to a database file (.db"),
    ("export-storage-not-a-url", ("best", "transpose", "--storage", "sqlite:/x.db"), {}, "sqlite:/x.db: not a URL"),
    ("storage-below-a-file", (*REPLAY, "--storage", "{d}/f/x.db"), {"f": ""}, "is not a folder"),
    (
        "storage-read-only-url",
        (*REPLAY, "--storage", "sqlite:///file:{d}/ro.db?mode=ro&uri=true"),
        {"ro.db": lambda p: p.write_bytes(RECORDING.read_bytes())},
        "opens the database read-only",
    ),
    (
        "storage-read-only-immutable",
        (*REPLAY, "--storage", "sqlite:///file:{d}/ro.db?immutable=1&uri=true"),
        {"ro.db": lambda p: p.write_bytes(RECORDING.read_bytes())},
        "opens the database read-only",
    ),
    ("study-name-empty", (*REPLAY, "--study-name", ""), {}, "--study-name '': empty"),
    ("study-name-slash", (*REPLAY, "--study-name", "a/b"), {}, "holds a path separator"),
    ("study-name-dotdot", (*REPLAY, "--study-name", "../../etc/x"), {}, "holds a path separator"),
    ("study-name-backslash", (*REPLAY, "--study-name", "a\\b"), {}, "holds a path separator"),
    ("study-name-bell", (*REPLAY, "--study-name", "a\x07b"), {}, "does not print"),
    ("study-name-newline", (*REPLAY, "--study-name", "a\nb"), {}, "does not print"),
    ("study-name-flag", (*REPLAY, "--study-name=-x"), {}, "starts with '-'"),
    ("study-name-too-long", (*REPLAY, "--study-name", "x" * 513), {}, "at most 512"),
    ("large-file", ("render", "{d}/s.yaml"), {"s.yaml": "# " + "x" * (2 << 20)}, "larger than 1 MiB"),
    ("deep-yaml", ("render", "{d}/s.yaml"), {"s.yaml": "params: " + "[" * 5000 + "]" * 5000}, "YAML"),
    (
        "problem-size-too-large",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space().replace("n: 1048576", "n: 100000000000000000000000")},
        "64-bit",
    ),
    (
        "export-kt-cache-unwritable",
        ("export", "transpose", "--storage", str(RECORDING), "--kt-cache", "/proc/x.json"),
        {},
        "/proc/x.json",
    ),
    ("new-name-not-ascii", ("new", "größe"), {}, "tuner new größe: the name must be a C identifier"),
    ("new-name-digit-first", ("new", "1copy"), {}, "the name must be a C identifier"),
    (
        "param-name-not-ascii",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space(params=COPY_PARAMS.replace("  items: [1, 2]\n", "  items: [1, 2]\n  größe: [1]\n"))},
        "s.yaml:8: parameter name 'größe' is not a C identifier",
    ),
    (
        "derived-name-not-ascii",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space().replace("derived:\n", "derived:\n  größe: block * 2\n")},
        "s.yaml:9: derived: name 'größe' is not a C identifier",
    ),
    (
        "kernel-name-not-ascii",
        ("render", "{d}/stencil2d.yaml"),
        {
            "stencil2d.yaml": STENCIL.replace("  name: stencil2d ", "  name: größe "),
            "stencil2d.cu": (EXAMPLES / "stencil2d.cu").read_text(),
            "ref.py": (EXAMPLES / "ref.py").read_text(),
        },
        "stencil2d.yaml:5: kernel: name 'größe' is not a C identifier",
    ),
    (
        "kernel-argument-not-ascii",
        ("render", "{d}/stencil2d.yaml"),
        {
            "stencil2d.yaml": STENCIL.replace("{name: dst,", "{name: dßt,"),
            "stencil2d.cu": (EXAMPLES / "stencil2d.cu").read_text(),
            "ref.py": (EXAMPLES / "ref.py").read_text(),
        },
        "stencil2d.yaml:7: kernel: argument name 'dßt' is not a C identifier",
    ),
    (
        "export-header-unwritable",
        ("export", "transpose", "--storage", str(RECORDING), "--header", "/proc/x.h"),
        {},
        "--header /proc/x.h: directory /proc is not writable",
    ),
    (
        "export-kt-cache-missing-folder",
        ("export", "transpose", "--storage", str(RECORDING), "--kt-cache", "{d}/no/x.json", "--header", "{d}/x.h"),
        {},
        "--kt-cache {d}/no/x.json: no such directory",
    ),
    (
        "import-kt-corrupt-gzip",
        ("import-kt", "{d}/c.json.gz", "-o", "{d}/s.yaml"),
        {"c.json.gz": CORRUPT_GZIP},
        "c.json.gz: cannot decompress: corrupt gzip data",
    ),
    (
        "replay-corrupt-gzip-cache",
        (*STUDY, "--replay", "{d}/c.json.gz"),
        {"c.json.gz": CORRUPT_GZIP},
        "c.json.gz: cannot decompress: corrupt gzip data",
    ),
    (
        "replay-corrupt-gzip-db",
        (*STUDY, "--replay", "{d}/r.db.gz"),
        {"r.db.gz": CORRUPT_GZIP},
        "r.db.gz: cannot decompress",
    ),
    (
        "derived-string-breaks-out",
        ("render", "{d}/s.yaml"),
        {"s.yaml": copy_space().replace("derived:\n", "derived:\n  note: \"'*/ evil(); /*'\"\n")},
        "not an identifier",
    ),
]


def drawn_not_listed(out: str) -> None:
    """Three distinct valid configs of the huge space, drawn at random: a listing would start at the first
    declared values (a = b = ... = 1), where a bounded walk of 10^18 points would also end."""
    configs = [c["params"] for c in json.loads(out)["configs"]]
    assert len(configs) == 3 and len({json.dumps(c, sort_keys=True) for c in configs}) == 3
    assert all(c["f"] > 500 for c in configs)
    assert all(c["a"] != 1 or c["b"] != 1 for c in configs)


#: what a case with a valid result (fragment None) must print
RESULTS = {"huge-sample-is-drawn-not-listed": drawn_not_listed}


def snapshot(*folders: Path) -> dict[str, str]:
    out = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_input(case, tmp_path, monkeypatch, capsys):
    _, argv, files, fragment = case
    for name, content in files.items():
        path = tmp_path / name
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    monkeypatch.chdir(tmp_path)  # the default storage (studies/KERNEL.db) would land here
    monkeypatch.setattr(space_mod, "SPACES_DIR", ROOT / "search_spaces")
    before = snapshot(tmp_path, DATA)
    capsys.readouterr()
    rc = cli.main([a.format(d=tmp_path) for a in argv])
    out, err = capsys.readouterr()
    if fragment is None:
        assert rc == 0, err
        RESULTS[case[0]](out)
    else:
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1, err
        assert fragment.format(d=tmp_path) in lines[0], lines[0]
        assert "Traceback" not in err
    assert snapshot(tmp_path, DATA) == before, "a file was created or modified"


def test_derived_string_never_reaches_the_source(tmp_path):
    """A derived value that is a string with CUDA in it loads (it is data) but is refused at render."""
    path = tmp_path / "s.yaml"
    path.write_text(copy_space().replace("derived:\n", "derived:\n  stride2: \"'x */ evil(); /*' \"\n"))
    space = space_mod.load(path)
    family = kernels.get(space.kernel)
    params = dict(space.default)
    with pytest.raises(TemplateError, match="not an identifier"):
        render(family, params, space.resolve(params), space.problems[0].env)


HOSTILE = [
    'a\nextern "C" __global__ void evil(int* p){ *p = 1; }',
    "*/ evil(); /*",
    "x y",
    "1; }",
    "",
    "{{ 7*7 }}",
    "a-b",
    "ok\u00e9",
]


@pytest.mark.parametrize("path", space_mod.shipped_spaces(), ids=lambda p: p.stem)
def test_every_template_refuses_hostile_strings_in_every_param(path):
    space = space_mod.load(path)
    family = kernels.get(space.kernel)
    for name in space.params:
        for hostile in HOSTILE:
            params = {**space.default, name: hostile}
            with pytest.raises(TemplateError, match="not an identifier"):
                render(family, params, {**space.resolve(space.default), name: hostile}, space.problems[0].env)
    # and a space file cannot bring them in
    strings = [n for n, values in space.params.items() if any(isinstance(v, str) for v in values)]
    for name in strings:
        text = space.text.replace(f"  {name}: [", f'  {name}: ["{HOSTILE[1]}", ', 1)
        bad = Path(os.environ.get("TMPDIR", "/tmp")) / f"hostile_{os.getpid()}_{path.name}"
        bad.write_text(text)
        try:
            with pytest.raises(SpaceError, match="not an identifier"):
                space_mod.load(bad)
        finally:
            bad.unlink()


def test_shipped_string_values_are_identifiers():
    for path in space_mod.shipped_spaces():
        for values in space_mod.load(path).params.values():
            for v in values:
                assert not isinstance(v, str) or IDENTIFIER.fullmatch(v)


def test_spaces_listing_stays_fast_with_a_huge_space_in_the_folder(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "spaces"
    folder.mkdir()
    (folder / "huge.yaml").write_text(HUGE + "constraints:\n  - f > 500\n")
    (folder / "copy.yaml").write_text((ROOT / "search_spaces" / "copy.yaml").read_text())
    monkeypatch.setattr(space_mod, "SPACES_DIR", folder)
    assert cli.main(["spaces", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["huge"]["cartesian"] == 10**18  # exact arithmetic
    assert rows["huge"]["valid_exact"] is False and rows["huge"]["valid"] >= 0
    assert rows["copy"]["valid_exact"] is True and rows["copy"]["valid"] == space_mod.load("copy").count_valid()

    # an unsatisfiable one is named in one line
    (folder / "huge.yaml").write_text(HUGE + "constraints:\n  - a + f < 0\n")
    assert cli.main(["spaces"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "huge.yaml" in err[0] and "no valid config" in err[0]


def test_sample_of_a_huge_space_draws_valid_configs_without_listing():
    path = ROOT / "search_spaces" / "copy.yaml"
    space = space_mod.load(path)
    assert space.sample(5, seed=1) == space.sample(5, seed=1)  # seeded
    huge_text = HUGE + "constraints:\n  - f > 990\n"
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"huge_{os.getpid()}.yaml"
    tmp.write_text(huge_text)
    try:
        huge = space_mod.load(tmp)
        configs = huge.sample(4, seed=0)
        assert len(configs) == 4 and all(huge.validate(c) is None for c in configs)
        assert all(c["a"] != 1 or c["b"] != 1 for c in configs)  # drawn, not the start of a listing
        assert len({json.dumps(c, sort_keys=True) for c in configs}) == 4
    finally:
        tmp.unlink()


def test_broken_pipe_exits_quietly():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from tuner.cli.main import main; sys.exit(main(['spaces', '--json']))"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    proc.stdout.close()  # the reader is gone before the first write, as with `| head` after its lines
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 0, err
    assert err == "", err


@pytest.mark.parametrize("home", ["name-too-long", "not-searchable"])
def test_a_home_that_cannot_be_read_moves_the_caches_in_one_line(home, tmp_path):
    """A home the cache folders cannot even be looked for in (a folder on the way that cannot be searched, a
    name longer than the OS takes) is a cache folder that cannot be written: the caches move to the temporary
    folder, one line says so, and the command runs."""
    if home == "name-too-long":
        folder = tmp_path / ("h" * 300)  # never made: stat() of a path under it fails with ENAMETOOLONG
        fault = "File name too long"
    else:
        if os.geteuid() == 0:
            pytest.skip("root searches any folder")
        folder = tmp_path / "locked"
        folder.mkdir(mode=0o000)
        fault = "Permission denied"
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_CACHE_DIR", "CUPY_CACHE_DIR", "XDG_CACHE_HOME")}
    env.update(HOME=str(folder / "home"), TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    before = snapshot(DATA)
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "render", "copy"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr
    assert f"cannot be written ({fault}); caching in {tmp_path}/tuner-" in lines[0], lines[0]
    assert "__global__" in proc.stdout
    assert snapshot(DATA) == before


def test_replay_delay_is_checked_before_anything_starts():
    from tuner.space import limits

    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InputError, match="--replay-delay"):
            limits.replay_delay(bad)
    assert limits.replay_delay(0.0) == 0.0


# ---------------------------------------------------------------------------------------------------------------
# Ctrl-C in a terminal


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def in_terminal(argv, cwd: Path, press_when, limit_s: float = 300.0) -> tuple[int, str, str, bool]:
    """Run ``python -m tuner ARGV`` as the foreground job of a pseudo-terminal, and type Ctrl-C (which the
    terminal sends as SIGINT to the whole foreground process group) once ``press_when(pid, output so far)`` says
    so. (exit code, output before the key, output after it, whether it was pressed)."""
    import pty
    import select

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color", "COLUMNS": "160"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader whose controlling terminal is the pty
        try:
            os.chdir(cwd)
            os.execve(sys.executable, [sys.executable, "-m", "tuner", *argv], env)
        finally:
            os._exit(127)
    before, after, pressed = b"", b"", False
    deadline = time.monotonic() + limit_s
    try:
        while time.monotonic() < deadline:
            if not pressed and press_when(pid, before):
                os.write(fd, b"\x03")
                pressed = True
            if select.select([fd], [], [], 0.02)[0]:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: the last process holding the terminal is gone
                    break
                if not data:
                    break
                if pressed:
                    after += data
                else:
                    before += data
        else:
            os.kill(pid, 9)
            pytest.fail(f"still running after {limit_s} s")
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(status), before.decode(errors="replace"), after.decode(errors="replace"), pressed


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BAR = re.compile(r"\b(\d+)/(\d+)\b")


def shown_lines(text: str) -> list[str]:
    """What a terminal shows of `text`, line by line, without colours, the echoed ^C and the progress bars'
    redraws."""
    parts = re.split(r"\r|\n|\x1b\[2K", text)
    lines = [ANSI.sub("", p).replace("^C", "").strip() for p in parts]
    return [line for line in lines if line and "━" not in line]


def told(output: str) -> int:
    """The most trials the progress bar has shown as told (counted: done, failed or pruned)."""
    return max((int(m.group(1)) for m in BAR.finditer(ANSI.sub("", output))), default=0)


def counted(db: Path) -> tuple[int, int]:
    """(studies, trials that count towards --trials) in a study database."""
    from tuner.store.schema import counted_trials

    with sqlite3.connect(db) as conn:
        names = [name for (name,) in conn.execute("SELECT study_name FROM studies")]
    found = counted_trials(db, names[0]) if len(names) == 1 else None
    return len(names), found[0] if found else 0


INTERRUPT_TRIALS = 40
INTERRUPTED_STUDY = (*STUDY[:2], "--trials", str(INTERRUPT_TRIALS), "--replay", str(RECORDING), "--replay-delay", "0.1")


def writer_started(pid: int, output: bytes) -> bool:
    return bool(child_pids(pid))  # the study's writer process: started first thing, while the study opens


def measuring(pid: int, output: bytes) -> bool:
    return told(output.decode(errors="replace")) >= 5


def finishing(pid: int, output: bytes) -> bool:
    return told(output.decode(errors="replace")) >= INTERRUPT_TRIALS  # the writer's last flush, the summary


@pytest.mark.parametrize("moment", [writer_started, measuring, finishing], ids=lambda f: f.__name__)
def test_ctrl_c_in_a_terminal_is_one_line_and_the_same_command_resumes(moment, tmp_path):
    """Ctrl-C reaches the whole foreground process group: the study's own processes (its writer) must not die of it
    mid-write, and the driver says one line and exits 130. The trials told before it are stored, and the same
    command runs the study on to its end."""
    rc, before, after, pressed = in_terminal(INTERRUPTED_STUDY, tmp_path, moment)
    assert pressed
    assert "Traceback" not in before + after, (before + after)[-4000:]
    db = tmp_path / "studies" / "transpose.db"
    if rc == 0:  # finishing: the study may end before the key arrives; it must then be whole
        assert moment is finishing and counted(db) == (1, INTERRUPT_TRIALS), after[-2000:]
    else:
        assert rc == 130, (before + after)[-2000:]
        assert shown_lines(after) == ["tuner: interrupted"], after[-2000:]
        assert all(": trials go to " in line for line in shown_lines(before)), before[-2000:]  # its first line
        if db.exists():
            studies, complete = counted(db)
            assert studies == 1 and complete >= told(before)
        else:
            assert moment is writer_started  # interrupted before the study was stored
    again = subprocess.run(
        [sys.executable, "-m", "tuner", *INTERRUPTED_STUDY],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stderr
    assert counted(db) == (1, INTERRUPT_TRIALS)


def test_ctrl_c_while_compiling_is_one_line_and_leaves_no_process(tmp_path):
    """`tuner check` compiles in processes of its own: Ctrl-C while they compile is one line, exit 130, and none of
    them is left running."""
    seen: list[int] = []

    def compiling(pid: int, output: bytes) -> bool:
        children = child_pids(pid)
        seen[:] = children
        return len(children) >= 2

    rc, before, after, pressed = in_terminal(
        ("check", "gemm", "--sample", "400", "--jobs", "2", "--arch", "sm_90"), tmp_path, compiling
    )
    assert pressed and rc == 130, (before + after)[-2000:]
    assert "Traceback" not in before + after
    assert shown_lines(after) == ["tuner: interrupted"], after[-2000:]
    for _ in range(100):  # they were told to stop as the command ended; give the kernel a moment to reap them
        if not any(Path(f"/proc/{pid}").exists() for pid in seen):
            break
        time.sleep(0.05)
    assert not any(Path(f"/proc/{pid}").exists() for pid in seen), seen

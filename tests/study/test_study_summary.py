"""What a study's summary says its time went to, and threads per block for a family that derives none.

"GPU busy" is the GPU time of the configs' own launches (Σ `Measurement.gpu_ms`), not the time a worker was
occupied; the summary splits the rest into compile, check (by stage) and timing. The real driver and local engine
(real NVRTC compiles in threads), real Optuna and a real SQLite study run over an in-process evaluator that answers
each config of the declarative scale_add example with a real Measurement after host work longer than its GPU
time, as a host-side reference check would; every third evaluation the check finds a wrong result, which carries its
stages too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import time
from pathlib import Path

import optuna
import pytest

from tuner.cli import main as cli
from tuner.core.gpufacts import DEFAULT_ARCH, GpuFacts
from tuner.core.result import Measurement, WrongResult
from tuner.gpu import discovery
from tuner.gpu.clock import human_seconds
from tuner.gpu.protocol import CHECK_PHASES, PHASES, Evaluator, Spent
from tuner.study import local
from tuner.study.driver import Driver
from tuner.study.options import StudyOptions
from tuner.study.progress import _gpu_busy_text, _time_in_text, time_split

ROOT = Path(__file__).resolve().parents[2]
SPACE = ROOT / "examples" / "scale_add" / "scale_add.yaml"

#: the host wall of one evaluation (its reference check), against GPU_MS of launches on the GPU
HOST_S = 0.08
GPU_MS = 4.0


def _phases(timed: bool) -> dict[str, float]:
    """The host stages of one evaluation: most of HOST_S in the reference; no timing after a failed check."""
    stages = {"inputs": 0.003, "reference": HOST_S - 0.012, "launch": 0.002, "compare": 0.004, "timing": 0.003}
    return stages if timed else {k: v for k, v in stages.items() if k in CHECK_PHASES}


class HostBoundEvaluator(Evaluator):
    """Answers a compiled scale_add config after HOST_S of host work: a Measurement whose launches took GPU_MS on
    the GPU, or (every third evaluation) a wrong result found by the check. Every result it returns is kept."""

    measures = True
    #: every result returned, by every instance (one GPU thread appends at a time)
    returned: list = []

    def __init__(self, gpu_index: int = 0):
        self.gpu_index = gpu_index
        self.evaluations = 0

    def start(self):
        facts = GpuFacts().to_dict()
        return {
            "gpu": "host-bound",
            "gpu_index": self.gpu_index,
            "arch": DEFAULT_ARCH,
            "ceiling_tbps": 4.0,
            "gpu_facts": facts,
        }

    def evaluate(self, request):
        compiled, config = request.compiled, request.config
        assert compiled is not None and compiled.ok  # a measuring evaluator gets the real cubin
        time.sleep(HOST_S)
        self.evaluations += 1
        if self.evaluations % 3 == 0:
            result = WrongResult(reason="max abs error 1.0", details={"phases_s": _phases(timed=False)})
        else:
            # Faster with wider vectors and more items per thread, so the study has a best.
            median_ms = 0.2 / (config["vec"] * config["items"]) ** 0.5 + config["block"] * 1e-5
            moved = 3 * 67108864 * 4
            result = Measurement(
                median_ms=median_ms,
                p20_ms=median_ms * 0.99,
                p80_ms=median_ms * 1.01,
                repetitions=10,
                bytes_moved=moved,
                flops=0,
                tbps=moved / median_ms / 1e9,
                tflops=0.0,
                ceiling_tbps=4.0,
                fraction_of_ceiling=moved / median_ms / 1e9 / 4.0,
                registers=compiled.registers,
                smem_static_bytes=compiled.smem_static_bytes,
                smem_dynamic_bytes=0,
                spill_bytes=compiled.spill_bytes,
                gpu="host-bound",
                uri=compiled.uri,
                threads_per_block=config["block"],
                gpu_ms=GPU_MS,
                phases_s=_phases(timed=True),
            )
        self.returned.append(result)
        return result

    def close(self):
        pass


@dataclasses.dataclass
class Run:
    summary: dict
    returned: list  # every result the evaluator returned
    table: str  # the printed summary, its cells as one line of text


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    """One study of 6 configs over `HostBoundEvaluator` (finalists off: the split counts the search alone)."""
    where = tmp_path_factory.mktemp("study")
    HostBoundEvaluator.returned = []
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(printed):
        patch.setenv("TUNER_CACHE_DIR", str(where / "cache"))
        patch.setattr(local, "isolated_gpu_evaluator", lambda i, timeout_s=60.0, ahead=None: HostBoundEvaluator(i))
        patch.setattr(discovery, "local_gpus", lambda: 1)  # the evaluator stands in for one GPU
        opts = StudyOptions(
            kernel="scale_add",
            space=str(SPACE),
            trials=6,
            storage=f"sqlite:///{where / 'summary.db'}",
            seed=0,
            gpus=1,
            finalists=0,
        )
        summary = Driver(opts).run()
    table = " ".join(printed.getvalue().replace("│", " ").split())
    return Run(summary, list(HostBoundEvaluator.returned), table)


def test_gpu_busy_counts_the_gpu_time_of_the_launches_not_the_workers_occupied_time(run):
    summary, returned = run.summary, run.returned
    measured = [r for r in returned if r.ok]
    assert len(returned) == summary["trials"] == 6 and len(measured) == 4  # the wrong results too
    assert summary["gpu_s"] == pytest.approx(len(measured) * GPU_MS / 1000, abs=1e-3)
    assert summary["gpu_time_missing"] == 0
    window = summary["gpu_window_s"]
    assert window >= len(returned) * HOST_S  # one GPU answers one config at a time
    assert summary["gpu_busy_fraction"] == pytest.approx(summary["gpu_s"] / window, abs=1e-3)
    # The worker was occupied for the host work too: about 20 times the GPU time.
    assert summary["workers_busy_fraction"] >= len(returned) * HOST_S / window - 1e-3
    assert summary["gpu_busy_fraction"] < summary["workers_busy_fraction"] / 10
    assert f"GPU busy {summary['gpu_busy_fraction']:.0%} (" in run.table
    assert f"workers occupied {summary['workers_busy_fraction']:.0%}" in run.table


def test_the_summary_splits_the_time_into_compile_check_and_timing(run):
    summary, returned = run.summary, run.returned
    # The stages add up over every result, the wrong results' details included.
    stages = {
        k: sum(r.phases_s.get(k, 0.0) if r.ok else r.details["phases_s"].get(k, 0.0) for r in returned) for k in PHASES
    }
    assert summary["phases_s"] == pytest.approx({"compile": summary["phases_s"]["compile"], **stages}, abs=1e-3)
    assert summary["phases_s"]["compile"] > 0  # real NVRTC compiles, timed in the compile threads
    share, window, threads = summary["phases_share"], summary["gpu_window_s"], summary["compile_threads"]
    check = sum(stages[k] for k in CHECK_PHASES)
    assert share["check"] == pytest.approx(check / window, abs=2e-3)
    assert share["timing"] == pytest.approx(stages["timing"] / window, abs=2e-3)
    assert share["compile"] == pytest.approx(summary["phases_s"]["compile"] / (summary["wall_s"] * threads), abs=2e-3)
    assert f"time in compile {human_seconds(summary['phases_s']['compile'])} (" in run.table
    assert f"check {human_seconds(check)} ({share['check']:.0%} of the GPU window: inputs" in run.table


def test_best_shows_the_threads_the_measurement_reported_for_a_family_that_derives_none(run, capsys):
    storage = run.summary["storage"]
    assert cli.main(["best", "scale_add", "--storage", storage, "--json"]) == 0
    best = json.loads(capsys.readouterr().out)
    trial = optuna.load_study(study_name=run.summary["study"], storage=storage).trials[best["number"]]
    assert "threads" not in trial.user_attrs["derived"] and "threads" not in trial.user_attrs  # none derived
    assert best["threads"] == best["params"]["block"] == trial.user_attrs["threads_per_block"]
    assert cli.main(["best", "scale_add", "--storage", storage]) == 0
    assert f"B spills, {best['params']['block']} threads/block" in capsys.readouterr().out


def _measurement(**kw) -> Measurement:
    figures = dict(
        median_ms=0.1,
        p20_ms=0.1,
        p80_ms=0.1,
        repetitions=10,
        bytes_moved=1,
        flops=0,
        tbps=1.0,
        tflops=0.0,
        ceiling_tbps=1.0,
        fraction_of_ceiling=1.0,
        registers=16,
        smem_static_bytes=0,
        smem_dynamic_bytes=0,
        spill_bytes=0,
    )
    return Measurement(**{**figures, **kw})


def test_measurements_without_gpu_time_give_no_figure_and_a_partial_sum_says_so():
    old = Spent()
    for _ in range(3):
        old.add(_measurement(), occupied_s=0.5)  # recorded before gpu_ms and phases_s existed
    summary = time_split(old, wall_s=2.0, window_s=2.0, gpus=1, compile_threads=4, measures=True)
    assert summary["gpu_busy_fraction"] is None and summary["gpu_time_missing"] == 3
    assert summary["workers_busy_fraction"] == 0.75
    assert _gpu_busy_text(summary) == "n/a: no measurement reported its GPU time (workers occupied 75%)"
    assert (
        _time_in_text(summary)
        == "compile 0.00 s (0% of 4 threads) · check and timing n/a (the evaluator reported no stages)"
    )

    old.add(_measurement(gpu_ms=200.0, phases_s={"timing": 0.3}), occupied_s=0.5)
    summary = time_split(old, wall_s=2.0, window_s=2.0, gpus=1, compile_threads=4, measures=True)
    assert summary["gpu_busy_fraction"] == 0.1 and summary["gpu_time_missing"] == 3
    assert _gpu_busy_text(summary).startswith("≥ 10% (0.2 s running the configs; 3 measurements reported no")


def test_a_replay_reports_its_workers_and_nothing_it_did_not_run():
    recorded = Spent()
    recorded.add(_measurement(gpu_ms=3.0, phases_s={"timing": 0.01}), occupied_s=0.25)
    summary = time_split(recorded, wall_s=1.0, window_s=1.0, gpus=1, compile_threads=None, measures=False)
    assert summary["workers_busy_fraction"] == 0.25
    assert summary["gpu_busy_fraction"] is None and summary["gpu_s"] is None and summary["phases_s"] is None


def test_a_ray_pool_sums_what_its_actors_returned_and_what_its_compile_tasks_took():
    import sys

    import ray
    import ray.cloudpickle

    from tuner.space import space as space_mod
    from tuner.study.cluster import Pool

    # The actors build this module's evaluator: sent by value, as the test module is not importable there.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    space = space_mod.load(SPACE)
    configs = list(space.enumerate())[:3]
    pool = Pool(space, space.problem(), HostBoundEvaluator, gpus=1, logical_gpus=1)
    try:
        for number, params in enumerate(configs):
            pool.submit(number, params)
        results: dict = {}
        deadline = time.time() + 120
        while len(results) < len(configs) and time.time() < deadline:
            results.update(pool.poll(0.2))
        spent = pool.spent()
    finally:
        pool.close()
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    measured = [r for r in results.values() if r.ok]
    assert len(results) == 3 and len(measured) == 2  # the third evaluation is a wrong result
    assert spent.evaluated == 3 and spent.gpu_timed == 2 and spent.gpu_s == pytest.approx(2 * GPU_MS / 1000)
    assert spent.phases_s == pytest.approx(
        {k: 2 * v + _phases(timed=False).get(k, 0.0) for k, v in _phases(timed=True).items()}
    )
    assert spent.compiles == 3 and spent.compile_s > 0
    assert spent.occupied_s >= 3 * HOST_S  # the actor's own count of its time in evaluate


# ---------------------------------------------------------------------------------------------------------------
# each kernel against its own roof: TB/s against the copy ceiling, TFLOP/s against the FP32 peak


H200_FACTS = dataclasses.replace(GpuFacts(), sm_count=132, measured=True).to_dict()  # as an H200's worker reads them


def _gemm_recording(db: Path, tflops: float) -> int:
    """A synthetic recording of six valid GEMM configs (its figures invented: `tflops` TFLOP/s at a 0.02 share
    of the copy ceiling), with the facts and clocks a study on an H200 stores. Returns the trial count."""
    from tuner.space import space as space_mod

    space = space_mod.load("gemm")
    study = optuna.create_study(study_name="gemm-recorded", storage=f"sqlite:///{db}", directions=["maximize"])
    study.set_user_attr("gpu", "NVIDIA H200")
    study.set_user_attr("arch", "sm_90")
    study.set_user_attr("gpu_facts", H200_FACTS)
    dists = {name: optuna.distributions.CategoricalDistribution(values) for name, values in space.params.items()}
    configs = space.sample(6, seed=4)
    for i, config in enumerate(configs):
        figure = tflops * (1 - 0.05 * i)  # the first config is the best
        attrs = {
            "median_ms": 2.8 / (1 - 0.05 * i),
            "p20_ms": 2.8,
            "p80_ms": 2.8,
            "repetitions": 10,
            "bytes_moved": 3 << 26,
            "flops": 2 * 4096**3,
            "tbps": 0.086,
            "tflops": figure,
            "ceiling_tbps": 4.3,
            "fraction_of_ceiling": 0.02,
            "registers": 128,
            "smem_static_bytes": 16384,
            "smem_dynamic_bytes": 0,
            "spill_bytes": 0,
            "gpu": "NVIDIA H200",
            "clocks": {"sm_clock_max_mhz": 1980},
        }
        study.add_trial(
            optuna.trial.create_trial(params=config, distributions=dists, values=[figure], user_attrs=attrs)
        )
    return len(configs)


def test_a_compute_bound_study_is_compared_with_the_fp32_peak_never_the_copy_ceiling(tmp_path):
    """A GEMM (TFLOP/s) replayed from an H200 recording: the summary puts its best against the FP32 peak from
    the GPU's facts (132 SMs × 128 lanes × 2 FLOP at 1980 MHz = 66.9 TFLOP/s), and says it is not measured;
    `tuner best` the same. The copy ceiling, a byte roof, is never its yardstick."""
    recording = tmp_path / "gemm.db"
    trials = _gemm_recording(recording, tflops=48.8)
    printed = io.StringIO()
    opts = StudyOptions(
        kernel="gemm",
        space="gemm",
        trials=trials,
        storage=f"sqlite:///{tmp_path / 'replayed.db'}",
        seed=0,
        replay=str(recording),
        replay_recorded_only=True,
        in_process=True,
    )
    with contextlib.redirect_stderr(printed):
        summary = Driver(opts).run()
    assert summary["best"]["tflops"] == pytest.approx(48.8)
    table = " ".join(printed.getvalue().replace("│", " ").split())
    assert re.search(
        r"48\.8 TFLOP/s, 0\.73× the FP32 peak \(66\.9 TFLOP/s from the GPU's facts: 132 SMs at 1980 MHz, "
        r"not measured\)",
        table,
    ), table
    assert "ceiling" not in table

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["best", str(tmp_path / "replayed.db")]) == 0
    assert "throughput: 48.800 TFLOP/s = 0.729 of the FP32 peak (66.9 TFLOP/s from the GPU's facts)" in out.getvalue()
    assert "copy ceiling" not in out.getvalue()
    # the exported header quotes the bytes against the byte roof and the FLOPs apart from it
    rc = cli.main(["export", str(tmp_path / "replayed.db"), "--header", str(tmp_path / "gemm.h")])
    assert rc == 0
    assert re.search(
        r"0\.086 TB/s = 0\.020 of the 4\.30 TB/s ceiling, 48\.80 TFLOP/s, median", (tmp_path / "gemm.h").read_text()
    )


def test_the_live_line_puts_each_unit_against_its_own_roof():
    """The progress line: TB/s with its share of the copy ceiling; TFLOP/s alone (the facts its peak needs come
    with the summary), never a share of the byte ceiling; a family without a throughput, its time."""
    from tuner.study.progress import Progress, Stats

    def line(unit: str, tbps: float, tflops: float) -> str:
        stats = Stats(unit, [])
        moved = 3 << 26
        stats.add(
            0,
            {"tile": 1},
            Measurement(
                median_ms=2.5,
                p20_ms=2.5,
                p80_ms=2.5,
                repetitions=10,
                bytes_moved=moved,
                flops=0,
                tbps=tbps,
                tflops=tflops,
                ceiling_tbps=4.3,
                fraction_of_ceiling=tbps / 4.3,
                registers=32,
                smem_static_bytes=0,
                smem_dynamic_bytes=0,
                spill_bytes=0,
                clocks={"sm_clock_max_mhz": 1980},
            ),
        )
        progress = Progress(False, 10, 0, stats)
        progress.update(1)
        return progress.bar.tasks[0].fields["info"]

    assert line("TB/s", 3.7, 0.0).startswith("best 3.70 TB/s (0.86× ceiling)")
    gemm = line("TFLOP/s", 0.086, 48.8)
    assert gemm.startswith("best 48.8 TFLOP/s ") and "ceiling" not in gemm and "×" not in gemm
    assert line("ms", 0.0, 0.0).startswith("best 2.5 ms ")


def test_the_fp32_peak_comes_from_facts_read_from_a_gpu():
    from tuner.core.gpufacts import compute_capability, fp32_peak_tflops

    assert fp32_peak_tflops(GpuFacts.from_dict(H200_FACTS), 1980) == pytest.approx(66.9, abs=0.05)
    assert fp32_peak_tflops(GpuFacts(), 1980) is None  # the defaults stand in for a GPU nobody asked
    assert fp32_peak_tflops(GpuFacts.from_dict(H200_FACTS), None) is None
    assert [compute_capability(a) for a in ("sm_90", "sm_90a", "sm_100", "compute_86", "x")] == [
        "9.0",
        "9.0",
        "10.0",
        "8.6",
        "",
    ]


def test_the_live_line_puts_a_gemm_against_the_fp32_peak_of_the_gpu_it_runs_on():
    """The progress line of a compute-bound study: TFLOP/s and its share of the FP32 peak from the GPU's facts and
    the clock its measurements report; TFLOP/s alone where the facts were not read from a GPU."""
    from tuner.study.progress import Stats, _live_figure

    figures = {"tflops": 48.8, "tbps": 0.086, "median_ms": 2.8, "fraction_of_ceiling": 0.02, "registers": 128}
    figures |= {"smem_bytes": 0, "clocks": {"sm_clock_max_mhz": 1980}}
    on_h200 = Stats("TFLOP/s", [], gpu=GpuFacts.from_dict(H200_FACTS))
    unknown = Stats("TFLOP/s", [], gpu=GpuFacts())
    for stats in (on_h200, unknown):
        stats._consider(0, {}, figures)
    assert _live_figure("TFLOP/s", on_h200.best, on_h200.fp32_peak()) == "48.8 TFLOP/s (0.73× FP32 peak)"
    assert _live_figure("TFLOP/s", unknown.best, unknown.fp32_peak()) == "48.8 TFLOP/s"

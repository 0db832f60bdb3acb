"""The results stage's face: everything a user reads out of a study, re-exported from the rooms that hold it.

- `tuner.results.studies`: opening studies in any storage, choosing trials (measured, Pareto, best, finalists), the
  study's context (family, problem, space) and GPU facts;
- `tuner.results.tables`: the Pareto front and every trial as DataFrames and CSV/JSON/Parquet files; the best summary;
- `tuner.results.plots`: the Pareto plot with the GPU's occupancy budgets;
- `tuner.results.header`: the C++17 header of tuned configs;
- `tuner.results.artifacts`: rendered source and PTX per trial for optuna-dashboard (back-fill of older studies);
- `tuner.build.files`: checked, atomic writes.
"""

from __future__ import annotations

from tuner.build.files import atomic_write, check_writable
from tuner.results.artifacts import AttachReport, attach_artifacts, compile_ptx, virtual_arch
from tuner.results.header import c_string, check_namespace, header_text, write_header
from tuner.results.plots import plot_pareto, register_budget, smem_budget
from tuner.results.studies import (
    StudyContext,
    best_trial,
    gpu_facts,
    pareto_trials,
    render_command,
    render_trial,
    study_context,
    throughput,
)
from tuner.results.tables import best_summary, pareto_frame, trial_record, trials_frame, write_pareto, write_trials
from tuner.store.artifacts import artifact_dir_for
from tuner.store.reading import get_storage, open_studies, open_study, resolve_storage, study_url
from tuner.store.schema import (
    goal,
    is_duplicate,
    is_feasible,
    is_measured,
    measured_trials,
    objective_value,
    throughput_unit,
)

__all__ = [
    "AttachReport",
    "StudyContext",
    "artifact_dir_for",
    "atomic_write",
    "attach_artifacts",
    "best_summary",
    "best_trial",
    "c_string",
    "check_namespace",
    "check_writable",
    "compile_ptx",
    "get_storage",
    "goal",
    "gpu_facts",
    "header_text",
    "is_duplicate",
    "is_feasible",
    "is_measured",
    "measured_trials",
    "objective_value",
    "open_studies",
    "open_study",
    "pareto_frame",
    "pareto_trials",
    "plot_pareto",
    "register_budget",
    "render_command",
    "render_trial",
    "resolve_storage",
    "smem_budget",
    "study_url",
    "study_context",
    "throughput",
    "throughput_unit",
    "trial_record",
    "trials_frame",
    "virtual_arch",
    "write_header",
    "write_pareto",
    "write_trials",
]

"""The space stage: a space file (YAML) → `SearchSpace`, and the checks that run before any work.

In: a space file's path, or a shipped space's name. Out: a `SearchSpace` (its family, problems, params, AST-checked
constraints and derived values, objectives, default config) that enumerates, samples and validates configs
without compiling anything. Fault: `tuner.errors.SpaceError` naming the file and line. `limits` checks
command-line values (counts, GPUs, samplers) before Ray, a GPU worker or a storage is touched.

Below it: the kernel families (`tuner.kernels`), expressions (`tuner.expr`), GPU facts and the result types.
"""

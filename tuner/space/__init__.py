"""The space stage: a space file (YAML) → `SearchSpace`, and the checks that run before any work.

In: a space file's path, or a shipped space's name. Out: a `SearchSpace` (its family, problems, params, AST-checked
constraints and derived values, objectives, default config) that enumerates, samples and validates configs
without compiling anything. Fault: `tuner.core.errors.SpaceError` naming the file and line. `limits` checks
command-line values (delays, arches, replay widths) and names the samplers and engines the command line offers;
this machine's GPUs are found in `tuner.gpu.discovery`.

Below it: the kernel families (`tuner.kernels`), expressions (`tuner.expr`), GPU facts and the result types.
"""

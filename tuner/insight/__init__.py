"""The insight stage: why a config is fast or slow, and the lesson's hands-on exercises.

In: a config (or a study's trials) and the GPU's measured ceiling. `ncu` profiles a config under Nsight Compute
(re-running it through the project's own single-config path) and reads its raw CSV; `explain` turns the counters
into verdicts in the lesson's terms (memory-bound or not, coalescing, bank conflicts, spills, over-fetch);
`roofline` draws the configs against the copy ceiling and the FP32 peak; `lesson` times the exercises with the
project's one protocol. Out: `Explanation`s, figures and tables. A GPU is needed to measure; reading recorded
profiles is not.
"""

"""The GPU stage: `Compiled` + family + config + problem → `Measurement`, or a typed failure with its reason.

Every evaluator implements one protocol (`protocol.Evaluator`): `evaluator.GpuEvaluator` in a process that owns a
GPU (it owns a `device.Device`, the GPU set up, and a `checks.Verification`, the correctness check over the
input sets of `verify`; timing in `timing`, the copy ceiling in `ceiling`, CUDA status codes in `status`),
`worker.IsolatedEvaluator` the same in a child process so that a fault or a hang (`deadline`) kills the child,
never the caller. `evaluate` runs one config end to end. Failures are `Invalid`, `CompileFailed`, `LaunchFailed`,
`WrongResult`, `TimedOut` (`tuner.core.result`); a bug in our own code still raises. `clock` turns start-up stamps into
seconds from the command's start; `discovery` finds this machine's GPUs (how many, their model, why none) and
refuses a GPU count or index they cannot meet, before any worker starts. The worker's own kernels: random inputs
and the one-pass output check in `devicekernels` (their CUDA C and compile in `kernelsource`), the timing protocol's
L2 flush and stream hold in `timingkernels`.
"""

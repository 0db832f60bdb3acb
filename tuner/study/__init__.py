"""The study stage: options, a space, an evaluator pool and a storage → an Optuna study, ask → evaluate → tell.

In: `options.StudyOptions` (what ``tuner study`` and `tuner.study(...)` are given). The driver (`driver.Driver`)
owns the study: Optuna samples from an in-memory copy (`search`: the sampler factory; `codec`: its view of the
space; `failures`: what it is told of failed configs; `validset`: the valid set, cached on disk, that it proposes
inside; `repair`: the repair of proposals that cannot be measured); an engine's pool evaluates configs (`pool`: the
one contract; `local` on this machine and `cluster` on Ray, two transports of one scheduling core, `scheduler`;
`replay` from a recorded study; `engines`: which one a study gets); the store stage's writer process mirrors every
trial into the durable storage and its lease row refuses a second driver on the same study (`tuner.store`);
`preflight` refuses a study that cannot start before anything starts; `progress` draws the bar and the summary;
`ahead` hands the study what its command started before it (the writer process, the GPU workers).
Several problems of a space in one command: `shapes` (a study per problem, transfer between them), run side by side
over one pool (`sidebyside`) or one after another over kept workers (`sharing`). Out: the summary of the run
(trials, wall time, GPUs, best, finalists). Any failure of a config is a trial, never a crash of the study.

Note: ``tuner.study`` is the API call; import this stage's modules by name (``from tuner.study import driver``).
"""

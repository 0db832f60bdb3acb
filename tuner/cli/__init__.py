"""The face's command line: `tuner ...`, a thin layer over the Python API (`tuner.api`) and the stages.

`main` builds the parser and runs a command; one module per command group holds its commands: `spaces` (spaces,
render, check, new), `gpu` (bench, ceiling), `study`, `results` (studies, pareto, export, dashboard, trials, best,
import-kt) and `lesson` (lesson, explain); `args` holds the flags' types, `starter` the files of ``tuner new``.
Bad input of any kind is one line on stderr and exit code 2; anything else that escapes is a bug and keeps its
traceback.
"""

"""The results stage: stored studies → what a user reads out of them.

In: a study in any storage (a study or kernel name under ``studies/``, a .db path, a storage URL), opened without
ever creating a database (`tuner.store.reading`); which of its trials count is the store's rule (`tuner.store.schema`).
Out: the studies of a storage and their best trials (`studies`), the Pareto front and every trial as DataFrames and
files (`tables`), the Pareto plot (`plots`), the C++17 header of tuned configs (`header`), each trial's CUDA source
and PTX as optuna-dashboard artifacts back-filled for studies recorded without them (`artifacts`, `dashboard`), and
tables fitted to the terminal (`console`). `export` is the stage's face. A sibling of the study stage: neither
imports the other. Bad input is an `InputError`.
"""

"""The results stage: stored studies → what a user reads out of them.

In: a study in any storage (a study or kernel name under ``studies/``, a .db path, a storage URL), opened without
ever creating a database (`studies`, `dbfiles`). Out: the Pareto front and every trial as DataFrames and files
(`tables`), the Pareto plot (`plots`), the C++17 header of tuned configs (`header`), each trial's CUDA source and
PTX as optuna-dashboard artifacts (`artifacts`, `dashboard`), Kernel Tuner cache files both ways (`kt`), and
tables fitted to the terminal (`console`). `export` is the stage's face. Bad input is an `InputError`.
"""

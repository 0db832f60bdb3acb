"""The store stage: a ``--storage`` value, a study's trials and its artifacts → the database, and back.

In: a ``--storage`` string (a SQLAlchemy URL or a database file's path) or none, trials and attributes to write, a
STUDY argument to read. Out: the storage's one URL (`dbfiles.study_storage_url`: the one normalisation of
``--storage`` and the one default, ``studies/KERNEL.db``), an opened Optuna storage (`dbfiles.open_storage`, never
on another program's database; `reading` opens stored studies to read without ever creating one), the check that
a study can write there (`probe`), the rules of which stored trials count and what "best" means for a study
(`schema`), the process that mirrors a driver's trials into the database (`writer`, in bulk through `trialwriter`),
the lease that refuses a second driver on a study (`lease`), each measured trial's source and PTX as Optuna
artifacts (`artifacts`), and Kernel Tuner cache files read as recordings and written from studies (`kt`).

Below both the study stage (which writes studies) and the results stage (which reads them): neither imports the
other, and both reach the database only through here. Bad input is an `InputError` naming the storage.
"""

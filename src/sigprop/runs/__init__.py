"""Sweeps that outgrow one process: a grid of tasks (:mod:`.grid`), the commands a task can run
(:mod:`.tasks`), the Parquet results store that survives being killed (:mod:`.store`) and the
executors that run the tasks, a local process pool or a Ray cluster (:mod:`.executors`).
docs/sweeps.md explains the whole in users' terms."""

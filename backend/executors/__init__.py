"""Executors: how an approved run reaches GPUs. `celery` sends it to the workers of its GPU queue (the default);
`slurm` makes it one sbatch job, followed by a poller in the API process. Chosen per GPU queue in settings
(ULAB_EXECUTOR_<QUEUE>=slurm) when the run is created, and kept on the run."""

"""The Slurm executor: the job script (jobscript.py), sbatch/scancel/scontrol (submit.py), and the API's poller of a
run's job (poller.py)."""

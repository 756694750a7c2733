"""The engines a run can be executed on, each seen from its own side only (a broker message, a Slurm job); none of
them knows the database. The table of executors, and what each needs of the API (a reaper, a poller), is
backend/executors/registry.py."""

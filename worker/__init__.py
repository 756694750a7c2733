"""Ulysses Lab's worker side: the Celery worker (agent), the probe and the Ulysses trainer (worker/trainer).

Every process of this package (and every process it starts: torchrun, the ranks) lets OpenMP's idle threads sleep
(`OMP_WAIT_POLICY=PASSIVE`) unless the environment says otherwise. torch's CPU ops and DeepSpeed's CPU Adam run on
libgomp, whose idle threads otherwise spin for ~300,000 iterations after each parallel region: when a rank's
threads share cores with anything else (another rank, the worker, the API, a second job), the spinning threads take
the cores the working ones need. Measured by `bench/omp_wait.py` (two tiny CPU trainings at once on 2 cores, each
with 2 threads): the median step was 36x the lone run's with the default policy and 1.2x with PASSIVE; a lone run
on idle cores pays ~1.4x per tiny step for the sleeping threads' wake-ups (bench/results/omp-wait-cpu.md). libgomp
reads the variable once, when torch loads it, so it is set here, before any module of the package imports torch.
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

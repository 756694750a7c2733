"""The Ulysses SP trainer: Transformers Trainer + Accelerate ParallelismConfig(sp_backend="deepspeed") + DeepSpeed.

Entry points: `cli.run_train` (`ulab train`), `python -m worker.trainer` (one rank under torchrun);
`launch_config` holds the pure plan -> DeepSpeed/Accelerate/torchrun translations.
"""

"""The Ulysses SP trainer: Transformers Trainer + Accelerate ParallelismConfig(sp_backend="deepspeed") + DeepSpeed.

Entry points: `cli.run_train` (`ulab train`), `python -m worker.trainer` (one rank under torchrun);
The plan and what it turns into (DeepSpeed config, Accelerate settings, torchrun command) come from `plan`.
"""

"""The keys DeepSpeed, Accelerate and the Transformers Trainer read, as the importer (plan.importer) checks a pasted
setup against them. Each list is copied from the library version pinned in pyproject.toml, with its source; the
unit test tests/unit/test_import_keys.py compares every list with the installed library, so an upgrade that adds or
drops a key fails there instead of drifting here.
"""
from __future__ import annotations

# DeepSpeed 0.19.8: the top-level keys of a ds_config that DeepSpeedConfig reads (deepspeed/runtime/config.py
# `_initialize_params`, constants.py, monitor/config.py `get_monitor_config`, and the sub-configs each block builds).
# Any other top-level key is read by nothing: DeepSpeed neither uses nor refuses it.
DEEPSPEED_TOP = frozenset("""
train_batch_size train_micro_batch_size_per_gpu gradient_accumulation_steps managed_gradient_accumulation
steps_per_print dump_state disable_python_gc disable_allgather communication_data_type
seq_parallel_communication_data_type sequence_parallel_size prescale_gradients gradient_predivide_factor
gradient_allreduce_op sparse_gradients zero_optimization activation_checkpointing comms_logger tensorboard wandb
csv_monitor comet gradient_clipping fp16 bf16 bfloat16 torch_autocast optimizer scheduler
zero_allow_untested_optimizer zero_force_ds_cpu_optimizer flops_profiler wall_clock_breakdown memory_breakdown
autotuning use_data_before_expert_parallelism hybrid_engine pipeline data_efficiency curriculum_learning checkpoint
data_types aio dataloader_drop_last log_level weight_quantization compile timers tensor_parallel expert_parallel
elasticity amp compression_training progressive_layer_drop sparse_attention eigenvalue quantize_training nebula
vocabulary_size
""".split())

# deepspeed/runtime/zero/config.py DeepSpeedZeroConfig: its fields and their `stage3_` aliases. The model forbids
# any other key (DeepSpeedConfigModel: extra="forbid"), so a typo stops `deepspeed.initialize`.
DEEPSPEED_ZERO = frozenset("""
stage contiguous_gradients reduce_scatter reduce_bucket_size use_multi_rank_bucket_allreduce allgather_partitions
allgather_bucket_size overlap_comm load_from_fp32_weights elastic_checkpoint offload_param offload_optimizer
sub_group_size cpu_offload_param cpu_offload_use_pin_memory cpu_offload prefetch_bucket_size
stage3_prefetch_bucket_size param_persistence_threshold stage3_param_persistence_threshold
model_persistence_threshold stage3_model_persistence_threshold max_live_parameters stage3_max_live_parameters
max_reuse_distance stage3_max_reuse_distance gather_16bit_weights_on_model_save
stage3_gather_16bit_weights_on_model_save module_granularity_threshold stage3_module_granularity_threshold
use_all_reduce_for_fetch_params stage3_use_all_reduce_for_fetch_params stage3_gather_fp16_weights_on_model_save
ignore_unused_parameters legacy_stage1 round_robin_gradients zero_hpz_partition_size zero_quantized_weights
zero_quantized_nontrainable_weights zero_quantized_gradients memory_efficient_linear pipeline_loading_checkpoint
override_module_apply log_trace_cache_warnings enable_sanity_checks allgather_sequential
stage3_allgather_sequential leaf_module zenflow compute_grad_norm parameter_alignment
save_muon_momentum_buffer_in_memory
""".split())
# deepspeed/runtime/zero/offload_config.py (extra="forbid" too)
DEEPSPEED_OFFLOAD_PARAM = frozenset("device nvme_path buffer_count buffer_size max_in_cpu pin_memory".split())
DEEPSPEED_OFFLOAD_OPTIMIZER = frozenset("""
device nvme_path buffer_count pin_memory pipeline_read pipeline_write fast_init ratio super_offload cpuadam_cores_perc
""".split())
# deepspeed/runtime/precision_config.py DeepSpeedBF16Config / DeepSpeedFP16Config (extra="forbid")
DEEPSPEED_BF16 = frozenset("enabled immediate_grad_update check_grad_overflow bf16_master_weights_and_grads "
                           "bf16_optimizer_states".split())
DEEPSPEED_FP16 = frozenset("enabled auto_cast loss_scale initial_scale_power loss_scale_window hysteresis "
                           "consecutive_hysteresis min_loss_scale fp16_master_weights_and_grads".split())

# accelerate 1.15.0: the top-level keys of an `accelerate launch --config_file` YAML (accelerate/commands/config/
# config_args.py ClusterConfig, whose from_yaml_file refuses any other key) ...
ACCELERATE_TOP = frozenset("""
compute_environment distributed_type mixed_precision use_cpu debug num_processes num_machines machine_rank
main_process_ip main_process_port rdzv_backend same_network main_training_function enable_cpu_affinity gpu_ids
deepspeed_config fsdp_config parallelism_config megatron_lm_config fp8_config dynamo_config tpu_name tpu_zone
tpu_use_cluster tpu_use_sudo command_file commands tpu_vm tpu_env mpirun_config downcast_bf16
""".split())
# ... and the keys `accelerate launch` reads from its `deepspeed_config` and `parallelism_config` sections (they
# become the launcher's arguments of the same name, accelerate/commands/launch.py; any other key becomes an argument
# nothing reads).
ACCELERATE_DEEPSPEED = frozenset("""
deepspeed_config_file deepspeed_exclusion_filter deepspeed_hostfile deepspeed_inclusion_filter
deepspeed_moe_layer_cls_names deepspeed_multinode_launcher gradient_accumulation_steps gradient_clipping
offload_optimizer_device offload_optimizer_nvme_path offload_param_device offload_param_nvme_path zero3_init_flag
zero3_save_16bit_model zero_stage
""".split())
ACCELERATE_PARALLELISM = frozenset("""
parallelism_config_cp_backend parallelism_config_cp_comm_strategy parallelism_config_cp_size
parallelism_config_dp_replicate_size parallelism_config_dp_shard_size parallelism_config_sp_attn_implementation
parallelism_config_sp_backend parallelism_config_sp_seq_length parallelism_config_sp_seq_length_is_variable
parallelism_config_sp_size parallelism_config_tp_size
""".split())

# transformers 5.23.0: every TrainingArguments field (transformers/training_args.py; HfArgumentParser refuses others
# in a JSON file) ...
TRAINER_FIELDS = frozenset("""
accelerator_config activation_checkpointing activation_checkpointing_kwargs adam_beta1 adam_beta2 adam_epsilon
auto_find_batch_size average_tokens_across_devices batch_eval_metrics bf16 bf16_full_eval data_seed
dataloader_drop_last dataloader_in_order dataloader_multiprocessing_context dataloader_num_workers
dataloader_persistent_workers dataloader_pin_memory dataloader_prefetch_factor ddp_backend ddp_broadcast_buffers
ddp_bucket_cap_mb ddp_find_unused_parameters ddp_static_graph ddp_timeout debug deepspeed disable_tqdm do_eval
do_predict do_train enable_jit_checkpoint eval_accumulation_steps eval_delay eval_do_concat_batches eval_on_start
eval_steps eval_strategy eval_use_gather_object fp16 fp16_full_eval fsdp fsdp_config full_determinism
gradient_accumulation_steps gradient_checkpointing gradient_checkpointing_kwargs greater_is_better hub_always_push
hub_model_id hub_private_repo hub_revision hub_strategy hub_token ignore_data_skip include_for_metrics
include_num_input_tokens_seen label_names label_smoothing_factor learning_rate length_column_name liger_kernel_config
load_best_model_at_end local_rank log_level log_level_replica log_on_each_node logging_first_step
logging_nan_inf_filter logging_steps logging_strategy lr_scheduler_kwargs lr_scheduler_type max_grad_norm max_steps
metric_for_best_model neftune_noise_alpha num_train_epochs optim optim_args optim_target_modules output_dir
parallelism_config per_device_eval_batch_size per_device_train_batch_size prediction_loss_only project push_to_hub
remove_unused_columns report_to restore_callback_states_from_checkpoint resume_from_checkpoint run_name
save_on_each_node save_only_model save_steps save_strategy save_total_limit seed skip_memory_metrics tf32
torch_compile torch_compile_backend torch_compile_mode torch_empty_cache_steps trackio_bucket_id trackio_space_id
trackio_static_space_id train_sampling_strategy use_cache use_cpu use_liger_kernel warmup_steps weight_decay
""".split())
# ... and the ones the importer maps, with their defaults, and their defaults (training_args.py).
TRAINER_DEFAULTS: dict[str, object] = {
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "max_grad_norm": 1.0, "bf16": False,
    "fp16": False, "gradient_checkpointing": None, "activation_checkpointing": None, "use_liger_kernel": False,
}

# Launcher options that say how many processes run where (deepspeed/launcher/runner.py, torch/distributed/run.py,
# accelerate/commands/launch.py), and the flags among each launcher's options that take no value.
DEEPSPEED_LAUNCHER_FLAGS = frozenset("--no_python --no_local_rank --no_ssh --no_ssh_check --force_multi "
                                     "--enable_each_rank_log --bind_cores_to_rank --module".split())
TORCHRUN_FLAGS = frozenset("--standalone --no-python --no_python --run-path --run_path --module -m".split())
ACCELERATE_FLAGS = frozenset("--cpu --multi_gpu --tpu --use_deepspeed --use_fsdp --use_megatron_lm --quiet -q "
                             "--module -m --no_python --debug --same_network --use_parallelism_config".split())

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class WorkerOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str = Field(description="the Celery node name")
    queues: list[str]
    started_at: datetime
    stopped_at: datetime | None = Field(description="set when the worker shut down; null while it runs")
    heartbeat_at: datetime | None = Field(description="the worker's last heartbeat (every ULAB_WORKER_HEARTBEAT_S)")
    state: str = Field(description="up; lost: no heartbeat for ULAB_WORKER_LOST_AFTER_S (killed without a shutdown "
                                   "report: its kernels no longer count); stopped: it shut down")
    gpu_model: str | None = Field(description="null: CPU ranks")
    gpu_count: int
    versions: dict[str, str | None] = Field(
        description="torch, cuda, deepspeed, transformers, accelerate, flash_attn (2.x), flash_attn_3, liger_kernel")
    attn_implementations: list[str] = Field(description="the training.attn_implementation values its ranks run")

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from backend.auth.roles import Role
from backend.auth.service import queue_list
from backend.core.queue import QUEUE_NAME
from backend.core.text import NoControlChars


class SignIn(BaseModel):
    token: str = Field(min_length=1, max_length=200)


class Identity(BaseModel):
    name: str
    role: Role
    token_id: int | None


QueueName = Annotated[str, Field(pattern=QUEUE_NAME)]


class TokenCreate(BaseModel):
    name: Annotated[str, NoControlChars] = Field(min_length=1, max_length=200)
    role: Role
    queues: list[QueueName] = Field(default=[], max_length=64,
                                    description="A worker token's queues (it claims runs of these only).")


class TokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    name: str
    role: Role
    prefix: str
    queues: list[str] = []
    created_at: datetime

    @field_validator("queues", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return sorted(queue_list(value)) if value is None or isinstance(value, str) else value
    revoked_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="Shown once; only its hash is stored.")

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from backend.auth.roles import Role
from backend.core.text import NoControlChars


class SignIn(BaseModel):
    token: str = Field(min_length=1, max_length=200)


class Identity(BaseModel):
    name: str
    role: Role
    token_id: int | None


class TokenCreate(BaseModel):
    name: Annotated[str, NoControlChars] = Field(min_length=1, max_length=200)
    role: Role


class TokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    name: str
    role: Role
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="Shown once; only its hash is stored.")

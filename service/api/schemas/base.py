"""What every response model shares: the dictionaries the services build are validated into these models and
written back out with only the keys they held (routes serialize with ``exclude_unset``), so a key the service leaves
out stays out, and the OpenAPI document describes every success body."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

Number = int | float  # an int stays an int and a float a float on the way out (never 5 → 5.0)
JSON = dict[str, Any]


class Out(BaseModel):
    """A response body: exactly these keys (a key a service adds without its model here fails the tests, and the
    document says ``additionalProperties: false``)."""

    model_config = ConfigDict(extra="forbid")


class WarningOut(Out):
    """A warning beside a success: what the caller should know (the request was carried out)."""

    rule: str = Field(description="What the warning is about.")
    message: str = Field(description="For people.")
    field: str | None = Field(default=None, description="The request field it is about, when there is one.")
    rollout: str | None = Field(default=None, description="The rollout it names, when there is one.")
    nodes: list[str] | None = Field(default=None, description="The nodes it names (at most 50), when it names some.")

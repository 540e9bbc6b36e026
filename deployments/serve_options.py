"""A section's ``deployment:`` block -> the options Serve's ``.options()`` takes, checked
against Serve's own schema when the app is built, so a misspelt key fails the deploy
naming it instead of being dropped."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError
from ray.serve.config import AutoscalingConfig
from ray.serve.schema import DeploymentSchema, RayActorOptionsSchema

# Serve's own models of the nested blocks; their keys are checked one level down.
_NESTED: dict[str, type[BaseModel]] = {
    "autoscaling_config": AutoscalingConfig, "ray_actor_options": RayActorOptionsSchema}


def _unknown(where: str, options: dict[str, Any], schema: type[BaseModel],
             reserved: frozenset[str] = frozenset()) -> list[str]:
    known = set(schema.model_fields) - reserved
    problems = []
    for key in sorted(set(options) - known):
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"{where}.{key} is not a Ray Serve deployment option{hint}")
    return problems


def deployment_options(section: str, name: str, block: dict[str, Any]) -> dict[str, Any]:
    """``block`` (a section's merged ``deployment:``) with the deployment's ``name``, as
    ``.options(**...)`` takes it; a ValueError naming every key Serve does not know, or
    Serve's own complaint about a value."""
    where = f"{section}.deployment"
    problems = _unknown(where, block, DeploymentSchema, frozenset({"name"}))
    for key, schema in _NESTED.items():
        if isinstance(block.get(key), dict):
            problems += _unknown(f"{where}.{key}", block[key], schema)
    if problems:
        raise ValueError("; ".join(problems))
    options = {**block, "name": name}
    try:
        DeploymentSchema.model_validate(options)
        for key, schema in _NESTED.items():  # the schema keeps these as plain dicts
            if isinstance(block.get(key), dict):
                schema.model_validate(block[key])
    except ValidationError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    return options

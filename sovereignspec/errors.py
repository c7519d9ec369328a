"""Turning pydantic validation errors into one message that names the field, the value and what is
accepted, the way users of this controller see them (CLI, Events, admission check messages)."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError


def describe(error: ValidationError, model: type[BaseModel] | None = None, where: str = "") -> str:
    """One line per problem: `where: field 'x': got 'y'; accepted: ...`."""
    lines = []
    for item in error.errors(include_url=False):
        loc = ".".join(str(p) for p in item["loc"]) or "(document)"
        accepted = _accepted(model, item["loc"]) if model is not None else None
        if item["type"] == "missing":
            text = f"field '{loc}' is missing"
        else:
            text = f"field '{loc}': got {item.get('input')!r}: {item['msg']}"
        if accepted:
            text += f"; accepted: {accepted}"
        lines.append(f"{where}: {text}" if where else text)
    return "\n".join(lines)


def _accepted(model: type[BaseModel], loc: tuple[int | str, ...]) -> str | None:
    if not loc or not isinstance(loc[0], str):
        return None
    field = model.model_fields.get(loc[0])
    if field is None:
        # pydantic reports aliases in loc; look them up too.
        field = next((f for f in model.model_fields.values() if f.alias == loc[0]), None)
    return field.description if field is not None else None


class ConfigError(ValueError):
    """Bad input from a file, an annotation or a flag; the message is meant for the user as is."""

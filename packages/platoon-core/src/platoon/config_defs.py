"""Rollout settings shared by training and evaluation configs (`RolloutConfig`, `InferenceParams`),
and the building blocks of every config model: `ConfigModel`, whose sections keep their field's default when a user
writes them partially, `lay_over`, and numeric types that never take a bool.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Self, Union, get_args, get_origin

from pydantic import (
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    Field,
    ModelWrapValidatorHandler,
    StrictBool,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, PydanticKnownError

from platoon.config.base import StrictModel
from platoon.deprecations import DeprecatedKey

__all__ = [
    "Bool",
    "ConfigModel",
    "Float",
    "InferenceParams",
    "Int",
    "RolloutConfig",
    "kept_defaults",
    "lay_over",
    "raise_problems",
    "section_default",
]

# ---------------------------------------------------------------------------------------------------------------
# Numbers that never take a bool. Lax pydantic reads `true` as 1; a config that writes `batch_size:
# true` is a mistake, so the bool is refused with the same error type strict mode would give.


def _refusing_bool(error_type: Literal["int_type", "float_type"]) -> BeforeValidator:
    def refuse(value: Any) -> Any:
        if isinstance(value, bool):
            raise PydanticKnownError(error_type)
        return value

    return BeforeValidator(refuse)


Int = Annotated[int, _refusing_bool("int_type")]
#: A finite float: every float in a config is a count, a time or a rate, and `.inf` would only hide a mistake.
Float = Annotated[float, _refusing_bool("float_type"), AllowInfNan(False)]
#: Only YAML's true/false: lax pydantic would also take 1, "yes" or "on".
Bool = StrictBool


# ---------------------------------------------------------------------------------------------------------------
# Laying one mapping over another: mappings merge key by key, anything else replaces.


def _strip_optional(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, UnionType):
        members = [a for a in get_args(annotation) if a is not NoneType]
        if len(members) == 1:
            return _strip_optional(members[0])
    return annotation


def section_model(model: type[BaseModel] | None, key: str) -> type[BaseModel] | None:
    """The model class of `model.<key>` when that field is a section (a nested model, possibly optional)."""
    if model is None or key not in model.model_fields:
        return None
    annotation = _strip_optional(model.model_fields[key].annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _renames(model: type[BaseModel] | None) -> list[tuple[str, str]]:
    keys: Mapping[str, DeprecatedKey] = getattr(model, "DEPRECATED_KEYS", {}) if model is not None else {}
    return [(old, key.renamed_to) for old, key in keys.items() if key.renamed_to is not None]


def _same_key(model: type[BaseModel] | None, key: str) -> set[str]:
    """`key` and the names it shares a value with: a renamed key and its old name count as one key."""
    names = {key}
    for old, new in _renames(model):
        if key in (old, new):
            names |= {old, new}
    return names


def lay_over(
    base: Mapping[str, Any], over: Mapping[str, Any], model: type[BaseModel] | None
) -> dict[str, Any]:
    """`over` laid over `base`, both raw mappings for `model`.

    Sections (fields whose type is a model) merge key by key; anything else replaces whole: free-form mappings
    (`extra`, `loss_fn_config`), lists, scalars, and null. A renamed key and its old name count as one key, so
    writing either one drops both from `base`.
    """
    result = dict(base)
    for key in over:
        for name in _same_key(model, key) - {key}:
            result.pop(name, None)
    for key, value in over.items():
        sub = section_model(model, key)
        below = result.get(key)
        if sub is not None and isinstance(value, Mapping) and isinstance(below, Mapping):
            result[key] = lay_over(below, value, sub)
        else:
            result[key] = value
    return result


def kept_defaults(
    base: Mapping[str, Any], over: Mapping[str, Any], model: type[BaseModel] | None
) -> dict[str, Any]:
    """The keys of `base` (dotted for sections) that laying `over` on it keeps, with their values."""
    kept: dict[str, Any] = {}
    written = {name for key in over for name in _same_key(model, key)}
    for key, value in base.items():
        sub = section_model(model, key)
        if key not in written:
            kept[key] = value
        elif sub is not None and isinstance(value, Mapping) and isinstance(over.get(key), Mapping):
            kept.update({f"{key}.{k}": v for k, v in kept_defaults(value, over[key], sub).items()})
    return kept


def yaml_scalar(value: Any) -> str:
    """A value as YAML would write it in a message: true/false/null, strings bare."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {yaml_scalar(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(yaml_scalar(v) for v in value) + "]"
    return str(value)


def section_default[M: BaseModel](model: type[M], *, description: str = "", **partial: Any) -> Any:
    """A field default built from a partial mapping, which a user's partial mapping is laid over.

    Use it where a field's default differs from its class's defaults: `eval.workflow_config` defaults to
    `group_size: 1, ...`, and a user writing `{group_size: 2}` keeps the other two. `ConfigModel` finds such fields
    by the marker on the factory and lays the user's mapping over `partial` before validating.
    """

    def factory() -> M:
        return model.model_validate(partial)

    factory.__laid_over__ = (model, partial)  # type: ignore[attr-defined]
    return Field(default_factory=factory, description=description)


def laid_over(factory: object) -> tuple[type[BaseModel], dict[str, Any]] | None:
    """The (model, partial mapping) a `section_default` factory builds from, else None."""
    return getattr(factory, "__laid_over__", None)


@functools.cache
def _laid_fields(cls: type[BaseModel]) -> dict[str, tuple[type[BaseModel], dict[str, Any]]]:
    fields = {}
    for name, info in cls.model_fields.items():
        laid = laid_over(info.default_factory)
        if laid is not None:
            fields[name] = laid
    return fields


def raise_problems(title: str, problems: Iterable[str], value: Any = None) -> None:
    """Raise every cross-field problem of one section at once, each as a `ValueError` at the section's path."""
    problems = list(problems)
    if len(problems) == 1:
        raise ValueError(problems[0])
    if problems:
        raise ValidationError.from_exception_data(
            title,
            [
                InitErrorDetails(type="value_error", loc=(), input=value, ctx={"error": ValueError(p)})
                for p in problems
            ],
        )


def _note_kept(title: str, exc: ValidationError, kept: Mapping[str, Mapping[str, Any]]) -> ValidationError:
    """`exc` with each construction error under a laid section noting the defaults that section kept."""
    details: list[InitErrorDetails] = []
    for error in exc.errors():
        loc, ctx = error["loc"], error.get("ctx") or {}
        note = kept.get(str(loc[0])) if loc else None
        if error["type"] == "value_error" and note:
            said = ", ".join(f"{key}: {yaml_scalar(value)}" for key, value in note.items())
            message = f"{ctx.get('error', error['msg'])} (laid over this section's defaults, it kept {said})"
            details.append(
                InitErrorDetails(
                    type="value_error", loc=loc, input=error["input"], ctx={"error": ValueError(message)}
                )
            )
        else:
            try:
                PydanticKnownError(error["type"], ctx or None)  # type: ignore[arg-type]
                kind: Any = error["type"]
            except KeyError:
                kind = PydanticCustomError(error["type"], error["msg"])
            details.append(InitErrorDetails(type=kind, loc=loc, input=error["input"], ctx=ctx))
    return ValidationError.from_exception_data(title, details)


class ConfigModel(StrictModel):
    """The strict base of platoon's config models: sections declared with `section_default` keep their defaults.

    A mode="wrap" model validator (a before step plus error notes) lays the raw mapping a user wrote for such a
    field over the field's partial default, so unset keys keep the field's default rather than the class's; a
    construction error in that section then says which defaults it kept.
    """

    @model_validator(mode="wrap")
    @classmethod
    def _lay_section_defaults(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        laid = _laid_fields(cls)
        if not laid or not isinstance(data, Mapping):
            return handler(data)
        data = dict(data)
        kept: dict[str, dict[str, Any]] = {}
        for name, (model, partial) in laid.items():
            value = data.get(name)
            if isinstance(value, Mapping):
                data[name] = lay_over(partial, value, model)
                kept[name] = kept_defaults(partial, value, model)
        try:
            return handler(data)
        except ValidationError as exc:
            noted = any(
                e["type"] == "value_error" and e["loc"] and kept.get(str(e["loc"][0])) for e in exc.errors()
            )
            if not noted:
                raise
            raise _note_kept(cls.__name__, exc, kept) from None


# ---------------------------------------------------------------------------------------------------------------
# Rollout settings

_REMOVED_IN = "0.3.0"


class InferenceParams(ConfigModel):
    """Sampling settings of a rollout's model calls: each fills what a call leaves unset (with `sampling_precedence:
    config` it also replaces a policy call's own); all None = the gateway's defaults (temperature 1.0, top_p 1.0,
    top_k -1, 4096 completion tokens)."""

    temperature: Float | None = Field(None, ge=0, description="sampling temperature; None = 1.0")
    top_p: Float | None = Field(None, ge=0, le=1, description="nucleus sampling mass; None = 1.0")
    top_k: Int | None = Field(None, ge=-1, description="top-k sampling, -1 = off; None = -1")
    max_completion_tokens: Int | None = Field(
        None, ge=1, description="completion tokens per call; None = 4096"
    )


class RolloutConfig(ConfigModel):
    """How one rollout runs: budgets, timeouts, sampling and subagent settings."""

    DEPRECATED_KEYS = {
        "propogate_root_success": DeprecatedKey(_REMOVED_IN, renamed_to="propagate_root_success"),
    }

    model_name: str | None = Field(None, description="model name recorded on the rollout")
    train: Bool = Field(False, description="whether the rollout is for training")
    max_steps: Int | None = Field(
        None, ge=0, description="overrides the task's step budget (only task-table rows carry their own)"
    )
    output_dir: str = Field("rollout_results", description="where rollouts write; commands override it")
    verbose: Bool = Field(True, description="log each rollout's progress")
    timeout: Float | None = Field(None, gt=0, description="the root agent's time limit in seconds")
    step_timeout: Float | None = Field(
        300.0,
        gt=0,
        description="time limit in seconds of each environment call (a tool call, the grading); past it the "
        "rollout is a `timeout` outcome; null: none",
    )
    return_dict: Bool = Field(False, description="return the rollout result as a dict")
    propagate_root_success: Bool | None = Field(
        None, description="give every agent of a successful tree the root's success; None = false"
    )
    propogate_root_success: Bool | None = Field(
        None, description="deprecated misspelling of propagate_root_success"
    )
    skip_subagent_reward_computation: Bool = Field(False, description="do not compute subagent rewards")
    enable_subagent_verifiers: Bool = Field(True, description="run verifier agents for subagents")
    inference_params: InferenceParams = Field(
        default_factory=InferenceParams, description="sampling settings of policy calls"
    )
    sampling_precedence: Literal["request", "config"] = Field(
        "request", description="`config`: policy calls always use inference_params' sampling settings"
    )
    extra: dict[str, Any] = Field(
        default_factory=dict, description="free-form settings for the rollout function"
    )
    judges: Bool = Field(True, description="run judges and verifiers (training may not turn them off)")

    @model_validator(mode="after")
    def _rename_propogate(self) -> Self:
        old, new = self.propogate_root_success, self.propagate_root_success
        if old is not None:
            if new is not None and new != old:
                raise ValueError(
                    f"propogate_root_success ({yaml_scalar(old)}) conflicts with propagate_root_success "
                    f"({yaml_scalar(new)}): propogate_root_success is its deprecated spelling; keep only "
                    "propagate_root_success"
                )
            self.propagate_root_success = old
        return self

"""What callers ask for: the one set of models for a job and a workflow, used by the API, the SDK and the commands.

A body is validated once, by these models (fields, bounds, values PostgreSQL
cannot store); the graph of a workflow is checked by the command that submits
it (`qforge.workflows.dag.validate`), which reports every problem at once.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any, Literal, Optional

from pydantic import (BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator,
                      model_validator)

from qforge.commands.errors import Invalid
from qforge.workflows import dag

NAME_PATTERN = r"^[A-Za-z0-9_.:\-]{1,200}$"
MAX_STEPS = 1000  # steps in one workflow or definition (docs/workflows.md): a longer body is a 422

# The one type of a step's `when`, in what callers send and in what the API answers (so
# every form a request takes comes back): a condition {"step", "path"?, "equals" |
# "not_equals" | "in"}, {"all" | "any": [...]} or {"not": ...} over conditions, or
# "otherwise". Its shape is checked with the graph (dag.validate: every problem at once).
When = dict[str, Any] | Literal["otherwise"]
STEPS_LIMIT = f"at most {MAX_STEPS} steps (past it: 422 naming the limit)"
# What a 422 says instead of the pattern itself (qforge.api.errors).
NAME_RULE = "1 to 200 characters, each a letter (A-Z, a-z), a digit, or one of _ . : -"
MAX_DEPTH = 64  # nesting of objects and lists in a body (serializers give up near 255)


def storable_problems(value: Any, where: str = "", depth: int = 0) -> list[str]:
    """What PostgreSQL could not store in jsonb/text, or we could not send back: NUL
    characters, lone surrogates, NaN/Infinity (which Python's JSON parser accepts), and
    nesting deeper than MAX_DEPTH."""
    problems: list[str] = []
    if depth > MAX_DEPTH:
        return [f"{where or 'value'}: nested more than {MAX_DEPTH} levels deep"]
    if isinstance(value, str):
        if "\x00" in value:
            problems.append(f"{where or 'value'}: NUL characters are not allowed")
        else:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                problems.append(f"{where or 'value'}: invalid Unicode (lone surrogate)")
    elif isinstance(value, float):
        if not math.isfinite(value):
            problems.append(f"{where or 'value'}: NaN and Infinity are not JSON numbers")
    elif isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            problems.extend(storable_problems(key, f"{path} (key)") if isinstance(key, str) else [])
            problems.extend(storable_problems(item, path, depth + 1))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problems.extend(storable_problems(item, f"{where}[{index}]", depth + 1))
    return problems


class Storable(BaseModel):
    """Rejects values PostgreSQL cannot store before anything else looks at them."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        problems = storable_problems(data)
        if problems:
            raise ValueError("; ".join(problems[:10]))
        return data


MAX_TAGS = 20  # tags one job or workflow carries: each is a row of execution_tags, copied to every event


def check_tags(tags: dict[str, str]) -> dict[str, str]:
    """Tags are searched as key:value, so a key holds no ':'; at most MAX_TAGS of them."""
    if len(tags) > MAX_TAGS:
        raise ValueError(f"{len(tags)} tags: at most {MAX_TAGS} (keys of 1-100 characters, values of at most 200)")
    for key, value in tags.items():
        if not key or ":" in key or len(key) > 100 or len(value) > 200:
            raise ValueError(f"tag {key!r}: keys must be 1-100 characters without ':', values at most 200")
    return tags


class FlowFields(BaseModel):
    """Flow control a job or a step may ask for (issue 16)."""

    concurrency_key: str | None = Field(default=None, min_length=1, max_length=200,
                                        description="at most concurrency_limit jobs with this key run at once")
    concurrency_limit: int | None = Field(default=None, ge=1, le=1_000_000)
    fairness_key: str | None = Field(default=None, min_length=1, max_length=200,
                                     description="a tenant: within a priority, claims go round-robin "
                                                 "across the keys that have due jobs")

    @model_validator(mode="after")
    def _key_and_limit(self):
        if (self.concurrency_key is None) != (self.concurrency_limit is None):
            raise ValueError("concurrency_key and concurrency_limit go together: give both or neither")
        return self


class JobSpec(FlowFields, Storable):
    """POST /jobs: `{"task", "payload"?, "queue"?, "priority"?, "max_retries"?, "run_at"? |
    "delay_seconds"?, "timeout_seconds"?, "tags"?, "idempotency_key"?}`."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, max_length=200)
    payload: dict[str, Any] = Field(default_factory=dict)
    queue: str = Field(default="default", pattern=NAME_PATTERN)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000, description="higher runs first")
    max_retries: int = Field(default=3, ge=0, le=1000,
                             description="retries after the first attempt: a job that always fails runs "
                                         "max_retries + 1 times")
    run_at: datetime | None = None
    delay_seconds: float | None = Field(default=None, ge=0, le=10 * 365 * 86400)
    timeout_seconds: float | None = Field(default=None, gt=0, le=7 * 86400)
    tags: dict[str, str] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        return check_tags(tags)

    @field_validator("run_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)  # naive times are UTC
        return value

    @model_validator(mode="after")
    def _one_schedule(self) -> "JobSpec":
        if self.run_at is not None and self.delay_seconds is not None:
            raise ValueError("give run_at or delay_seconds, not both")
        return self


class ForEach(BaseModel):
    """`for_each`: run the step once per element of step `step`'s output at `path`."""

    model_config = ConfigDict(extra="forbid")

    step: str = Field(min_length=1, max_length=200)
    path: str | None = Field(default=None, max_length=1000)


class StepSpec(FlowFields):
    """One step of POST /workflows. `type` is checked with the graph, so every problem
    of a definition is reported at once."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    step: str = Field(min_length=1, max_length=200)
    task: str | None = Field(default=None, min_length=1, max_length=200)
    payload: dict[str, Any] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list, max_length=1000)
    when: When | None = None
    on_failure: str | None = Field(default=None, max_length=200)
    type: str = Field(default="task", max_length=100, description="task (default) | wait_for_trigger | sleep | workflow")
    seconds: float | None = Field(default=None, ge=0, le=30 * 86400)
    timeout_seconds: float | None = Field(default=None, gt=0, le=30 * 86400)
    max_retries: int = Field(default=3, ge=0, le=1000)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    queue: str = Field(default="default", pattern=NAME_PATTERN)
    backoff_base_seconds: float | None = Field(default=None, gt=0, le=86400)
    backoff_cap_seconds: float | None = Field(default=None, gt=0, le=30 * 86400)
    for_each: ForEach | None = None
    # type "workflow": the stored definition the child runs, and its inputs
    # (`definition` in JSON; the method definition() below is the step's graph part)
    definition_name: str | None = Field(default=None, alias="definition", min_length=1, max_length=200)
    inputs: dict[str, Any] | None = None
    max_parallel: int | None = Field(default=None, ge=1, le=100_000,
                                     description="with for_each: elements running at once")

    def definition(self) -> dag.StepDef:
        """The parts the DAG rules read."""
        when = self.when
        return dag.StepDef(name=self.step, type=self.type, task=self.task,
                           depends_on=tuple(self.depends_on), when=when,
                           on_failure=self.on_failure, seconds=self.seconds,
                           for_each=self.for_each.model_dump() if self.for_each else None,
                           max_parallel=self.max_parallel, definition=self.definition_name)


class ResultSpec(BaseModel):
    """`result`: the workflow's result is step `step`'s output (at `path`, if given)."""

    model_config = ConfigDict(extra="forbid")

    step: str = Field(min_length=1, max_length=200)
    path: str | None = Field(default=None, max_length=1000)


class WorkflowSpec(Storable):
    """POST /workflows: `{"name", "tags"?, "idempotency_key"?, "result"?, "deadline_seconds"?,
    "steps": [...]}`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    tags: dict[str, str] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    result: ResultSpec | None = None
    deadline_seconds: float | None = Field(default=None, gt=0, le=365 * 86400, description=(
        "the workflow fails with reason deadline when it runs longer (running steps are stopped)"))
    steps: list[StepSpec] = Field(min_length=1, max_length=MAX_STEPS, description=STEPS_LIMIT)

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        return check_tags(tags)

    def problems(self) -> list[str]:
        """Every problem of the graph (empty: it may be stored)."""
        problems = dag.validate([step.definition() for step in self.steps])
        if self.result is not None and self.result.step not in {step.step for step in self.steps}:
            problems.append(f"result names unknown step '{self.result.step}'")
        for step in self.steps:  # fields that mean nothing on this kind of step
            if step.max_parallel is not None and step.for_each is None:
                problems.append(f"step '{step.step}': max_parallel is only for a for_each step")
            if step.inputs is not None and step.type != "workflow":
                problems.append(f"step '{step.step}': inputs are only for a workflow step")
        return problems


# A batch's payloads: one validation over the list, no model per job (qforge.enqueue_many).
_PAYLOADS = TypeAdapter(list[Optional[dict[str, Any]]])
# Options that name one job, not a batch: each job of a batch would carry the same.
PER_JOB_OPTIONS = ("idempotency_key", "payload")


def parse_batch(task: str, payloads: list[Any], options: dict[str, Any]) -> tuple[JobSpec, list[Any]]:
    """A batch of jobs that share task and options and differ in their payloads: the shared part
    validated once by JobSpec (as POST /jobs would), the payloads by one pass over the list (each a
    JSON object or None, storable as the spec's payload is), or Invalid naming each problem
    (`payloads.3.x`). Nothing is built per job."""
    given = [name for name in PER_JOB_OPTIONS if name in options]
    if given:
        raise Invalid(f"{given[0]}: one per job, not per batch: enqueue such jobs one by one",
                      [{"field": name, "message": "not an option of a batch"} for name in given])
    shared = parse_spec(JobSpec, {"task": task, **options})
    try:
        payloads = _PAYLOADS.validate_python(payloads)
    except ValidationError as exc:
        details = [{"field": ".".join(str(p) for p in ("payloads", *error["loc"])), "message": str(error["msg"])}
                   for error in exc.errors()]
        raise Invalid("; ".join(f"{d['field']}: {d['message']}" for d in details[:10]), details) from None
    problems = [problem for index, payload in enumerate(payloads) if payload  # None and {} hold nothing
                for problem in storable_problems(payload, f"payloads[{index}]", 1)]
    if problems:
        raise Invalid("; ".join(problems[:10]), [{"field": problem.split(":")[0], "message": problem}
                                                 for problem in problems[:10]])
    return shared, payloads


def parse_spec(model: type[BaseModel], data: Any) -> Any:
    """`data` validated by `model` (JobSpec, WorkflowSpec...), or Invalid with one
    {"field", "message"} detail per problem: how the SDK and qforge.enqueue refuse bad input
    before anything is sent."""
    if isinstance(data, model):
        return data
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        details = [{"field": ".".join(str(p) for p in error["loc"]) or "body",
                    "message": str(error["msg"]).removeprefix("Value error, ")}
                   for error in exc.errors()]
        raise Invalid("; ".join(f"{d['field']}: {d['message']}" for d in details), details) from None

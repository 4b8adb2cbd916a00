"""The DAG rules, as pure functions: validate a definition, decide what happens next.

No I/O here, so the rules are property-tested directly (tests/test_dag.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from qforge.events import types as ev
from qforge.events.states import BLOCKED, DEAD, JOB_FINISHED, PENDING, SKIPPED, STEP_FINE, SUCCEEDED, WAITING

STEP_TYPES = ("task", "wait_for_trigger", "sleep", "workflow")
# Steps that no worker runs and that the DAG rules start themselves: they are created blocked.
STARTED_BY_THE_RULES = frozenset({"workflow"})
# What the evaluator marks a step it just unblocked, within one evaluation (not a stored status).
UNBLOCKED = "unblocked"


@dataclass(frozen=True)
class StepDef:
    """The parts of a step definition that the DAG rules read."""

    name: str
    type: str = "task"
    task: str | None = None
    depends_on: tuple[str, ...] = ()
    when: dict[str, Any] | str | None = None  # a condition, or "otherwise"
    on_failure: str | None = None
    seconds: float | None = None
    for_each: dict[str, Any] | None = None  # {"step", "path"}: run once per element of that list
    max_parallel: int | None = None  # elements running at once (None: all)
    definition: str | None = None  # a workflow step: the stored definition its child runs

    def dependencies(self) -> tuple[str, ...]:
        """depends_on plus the steps a `when` condition or a `for_each` reads (always dependencies)."""
        found = self.depends_on
        extras = condition_steps(self.when) + ([self.for_each.get("step")] if isinstance(self.for_each, dict) else [])
        for extra in extras:
            if isinstance(extra, str) and extra not in found:
                found = (*found, extra)
        return found


OTHERWISE = "otherwise"  # `when`: none of the siblings' conditions on the same upstream step matched
COMBINATORS = ("all", "any", "not")


def condition_steps(when: Any) -> list[str]:
    """The steps a condition reads (its leaves), in order."""
    if not isinstance(when, dict):
        return []
    if "all" in when or "any" in when:
        parts = when.get("all", when.get("any"))
        return [name for part in (parts if isinstance(parts, list) else []) for name in condition_steps(part)]
    if "not" in when:
        return condition_steps(when["not"])
    return [when["step"]] if isinstance(when.get("step"), str) else []


def handlers_of(steps: Iterable[StepDef]) -> dict[str, list[str]]:
    """handler step -> the steps whose on_failure names it."""
    handled: dict[str, list[str]] = {}
    for step in steps:
        if step.on_failure:
            handled.setdefault(step.on_failure, []).append(step.name)
    return handled


def validate(steps: list[StepDef]) -> list[str]:
    """Every problem with a definition, so the caller can report them all at once."""
    problems: list[str] = []
    if not steps:
        return ["a workflow needs at least one step"]
    names = [s.name for s in steps]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            problems.append(f"duplicate step name '{name}'")
        seen.add(name)
    known = set(names)
    handlers = handlers_of(steps)
    for step in steps:
        where = f"step '{step.name}'"
        if step.type not in STEP_TYPES:
            problems.append(f"{where}: unknown type '{step.type}' (expected one of {', '.join(STEP_TYPES)})")
        if step.type == "task" and not step.task:
            problems.append(f"{where}: 'task' is required for a task step")
        if step.type == "workflow" and not step.definition:
            problems.append(f"{where}: 'definition' is required for a workflow step")
        if step.type != "workflow" and step.definition:
            problems.append(f"{where}: 'definition' is only for a workflow step")
        if step.type == "sleep" and (step.seconds is None or step.seconds < 0):
            problems.append(f"{where}: a sleep step needs 'seconds' (>= 0)")
        for dep in step.depends_on:
            if dep == step.name:
                problems.append(f"{where} depends on itself")
            elif dep not in known:
                problems.append(f"{where} depends on unknown step '{dep}'")
        if step.when is not None:
            problems.extend(_condition_problems(step, known))
        if step.for_each is not None:
            problems.extend(_for_each_problems(step, known))
        if step.on_failure is not None:
            if step.on_failure == step.name:
                problems.append(f"{where}: on_failure names the step itself")
            elif step.on_failure not in known:
                problems.append(f"{where}: on_failure names unknown step '{step.on_failure}'")
        if step.name in handlers and (step.depends_on or step.when):
            problems.append(
                f"{where} is the failure handler of {', '.join(repr(h) for h in handlers[step.name])}"
                " and so must not declare depends_on or when (it runs when they die)")
    cycle = find_cycle(steps)
    if cycle:
        problems.append("cycle: " + " -> ".join(cycle))
    return problems


def _condition_problems(step: StepDef, known: set[str]) -> list[str]:
    where = f"step '{step.name}'"
    if step.when == OTHERWISE:
        return [] if step.depends_on else [f"{where}: 'when: otherwise' needs depends_on (the upstream step"
                                            " whose siblings' conditions it completes)"]
    return _condition_shape_problems(step.when, step.name, known, f"{where}: 'when'", 0)


def _condition_shape_problems(when: Any, name: str, known: set[str], where: str, depth: int) -> list[str]:
    if depth > 16:
        return [f"{where}: conditions nested more than 16 deep"]
    if isinstance(when, dict) and any(k in when for k in COMBINATORS):
        keys = [k for k in COMBINATORS if k in when]
        if len(keys) != 1 or len(when) != 1:
            return [f"{where} takes exactly one of all, any, not (alone)"]
        key = keys[0]
        if key == "not":
            return _condition_shape_problems(when["not"], name, known, f"{where}.not", depth + 1)
        parts = when[key]
        if not isinstance(parts, list) or not parts:
            return [f"{where}.{key} must be a non-empty list of conditions"]
        return [p for i, part in enumerate(parts)
                for p in _condition_shape_problems(part, name, known, f"{where}.{key}[{i}]", depth + 1)]
    if not isinstance(when, dict) or not isinstance(when.get("step"), str):
        return [f"{where} needs a 'step'" if isinstance(when, dict)
                else f"{where} must be a condition object or \"otherwise\""]
    problems = []
    if when["step"] == name:
        problems.append(f"{where} reads the step itself")
    elif when["step"] not in known:
        problems.append(f"{where} names unknown step '{when['step']}'")
    unknown = sorted(set(when) - {"step", "path", "equals", "not_equals", "in"})
    if unknown:
        problems.append(f"{where}: unknown field(s) {', '.join(unknown)}")
    tests = [k for k in ("equals", "not_equals", "in") if k in when]
    if len(tests) != 1:
        problems.append(f"{where} needs exactly one of equals, not_equals, in")
    elif tests[0] == "in" and not isinstance(when["in"], list):
        problems.append(f"{where}.in must be a list")
    if "path" in when and when["path"] is not None and not isinstance(when["path"], str):
        problems.append(f"{where}.path must be a string")
    return problems


def _for_each_problems(step: StepDef, known: set[str]) -> list[str]:
    source, where = step.for_each or {}, f"step '{step.name}'"
    problems = []
    if step.type != "task":
        problems.append(f"{where}: for_each needs a task step (not {step.type})")
    if source.get("step") == step.name:
        problems.append(f"{where}: 'for_each' reads the step itself")
    elif source.get("step") not in known:
        problems.append(f"{where}: 'for_each' names unknown step '{source.get('step')}'")
    return problems


def find_cycle(steps: list[StepDef]) -> list[str] | None:
    """One dependency cycle as [a, b, ..., a], or None (edges to unknown steps ignored).

    A depth-first search with a stack of its own, not Python's: a chain as long as the
    step limit (specs.MAX_STEPS) would pass the interpreter's recursion limit."""
    graph: dict[str, list[str]] = {}
    for step in steps:  # a duplicated name keeps the edges of every copy: its cycles still show
        graph.setdefault(step.name, []).extend(d for d in step.dependencies() if d != step.name)
    state: dict[str, int] = {}  # 1 on the path, 2 done
    for root in graph:
        if root in state:
            continue
        path: list[str] = [root]  # the nodes being visited, root first
        pending = [iter(graph[root])]  # per node on the path: its dependencies not yet looked at
        state[root] = 1
        while path:
            dep = next((d for d in pending[-1] if d in graph and state.get(d) != 2), None)
            if dep is None:
                state[path.pop()] = 2
                pending.pop()
            elif state.get(dep) == 1:
                found = path[path.index(dep):] + [dep]
                return list(reversed(found))  # read in execution order: a -> b -> a
            else:
                state[dep] = 1
                path.append(dep)
                pending.append(iter(graph[dep]))
    return None


def read_path(output: Any, path: str | None) -> Any:
    value = output
    for part in (path or "").split(".") if path else []:
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def condition_holds(when: dict[str, Any], outputs: dict[str, Any]) -> bool:
    """Whether a condition holds over the steps' outputs (by step name)."""
    if "all" in when:
        return all(condition_holds(part, outputs) for part in when["all"])
    if "any" in when:
        return any(condition_holds(part, outputs) for part in when["any"])
    if "not" in when:
        return not condition_holds(when["not"], outputs)
    value = read_path(outputs.get(when["step"]), when.get("path"))
    if "equals" in when:
        return value == when["equals"]
    if "not_equals" in when:
        return value != when["not_equals"]
    return value in when.get("in", [])


def otherwise_holds(step: StepDef, states: dict[str, "StepState"], status: dict[str, str]) -> bool:
    """`when: otherwise`: no sibling (a step whose condition reads one of this step's upstream
    steps) has a condition that holds, its steps having succeeded."""
    upstream = set(step.depends_on)
    for name, state in states.items():
        when = state.definition.when
        if name == step.name or not isinstance(when, dict) or not upstream & set(condition_steps(when)):
            continue
        read = condition_steps(when)
        if all(status.get(r) == SUCCEEDED for r in read) and condition_holds(
                when, {r: states[r].output for r in read}):
            return False
    return True


def initial_status(step: StepDef, handlers: dict[str, list[str]]) -> str:
    if step.dependencies() or step.name in handlers or step.type in STARTED_BY_THE_RULES:
        return BLOCKED
    return PENDING if step.type == "task" else WAITING


@dataclass
class StepState:
    """A step as the evaluator sees it."""

    definition: StepDef
    status: str
    output: Any = None
    error: str | None = None


@dataclass(frozen=True)
class Decision:
    step: str
    event_type: str  # StepUnblocked | Skipped
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    decisions: list[Decision]
    workflow_event: str | None  # WorkflowSucceeded | WorkflowFailed | None (still running)
    error: str | None = None


def evaluate(states: dict[str, StepState]) -> Verdict:
    """Decide every step that can be decided now, then whether the workflow is over.

    A blocked step is unblocked exactly once, when all its dependencies
    succeeded and its condition holds; it is skipped when the condition fails
    or a dependency finished without succeeding (the cascade follows, since
    decisions are applied to `states` until nothing changes). A handler runs
    when a step it handles dies, and is skipped once they all finished alive.
    """
    status = {name: s.status for name, s in states.items()}
    handlers = handlers_of(s.definition for s in states.values())
    decisions: list[Decision] = []
    changed = True
    while changed:
        changed = False
        for name, state in states.items():
            if status[name] != BLOCKED:
                continue
            decision = _decide(state, states, status, handlers.get(name))
            if decision:
                decisions.append(decision)
                status[name] = SKIPPED if decision.event_type == ev.Skipped.type else UNBLOCKED
                changed = True
    if any(s not in JOB_FINISHED for s in status.values()):
        return Verdict(decisions, None)
    unhandled = [name for name, s in status.items()
                 if s not in STEP_FINE and not _handled(states[name], status)]
    if unhandled:
        errors = [f"{n} {status[n]}" + (f": {states[n].error}" if states[n].error else "")
                  for n in unhandled]
        return Verdict(decisions, ev.WorkflowFailed.type, "; ".join(errors))
    return Verdict(decisions, ev.WorkflowSucceeded.type)


def _handled(state: StepState, status: dict[str, str]) -> bool:
    """A dead step whose handler succeeded does not fail the workflow."""
    handler = state.definition.on_failure
    return status.get(state.definition.name) == DEAD and handler is not None \
        and status.get(handler) == SUCCEEDED


def _decide(state: StepState, states: dict[str, StepState], status: dict[str, str],
            handles: list[str] | None) -> Decision | None:
    step = state.definition
    if handles:
        died = [h for h in handles if status[h] == DEAD]
        if died:
            failed = states[died[0]]
            return Decision(step.name, ev.StepUnblocked.type, {
                "inputs": {failed.definition.name: {"error": failed.error}},
                "failed_step": failed.definition.name, "error": failed.error,
            })
        if all(status[h] in JOB_FINISHED for h in handles):
            return Decision(step.name, ev.Skipped.type, {"reason": "no handled step died"})
        return None
    deps = step.dependencies()
    for dep in deps:
        if status[dep] in JOB_FINISHED and status[dep] != SUCCEEDED:
            return Decision(step.name, ev.Skipped.type, {"reason": f"upstream step '{dep}' {status[dep]}"})
    if all(status[dep] == SUCCEEDED for dep in deps):
        if step.when == OTHERWISE:
            if not otherwise_holds(step, states, status):
                return Decision(step.name, ev.Skipped.type, {"reason": "a sibling's condition matched"})
        elif step.when is not None and not condition_holds(
                step.when, {name: states[name].output for name in condition_steps(step.when)}):
            return Decision(step.name, ev.Skipped.type, {"reason": "condition not met", "when": step.when})
        return Decision(step.name, ev.StepUnblocked.type,
                        {"inputs": {dep: states[dep].output for dep in deps}})
    return None

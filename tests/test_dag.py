"""The DAG rules as pure functions: validation and the evaluator, with property tests."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from qforge.workflows import dag
from qforge.workflows.dag import StepDef, StepState
from qforge.events.states import JOB_FINISHED


def test_validation_reports_every_problem_at_once():
    steps = [
        StepDef("a", task="echo"),
        StepDef("a", task="echo"),
        StepDef("b", task="echo", depends_on=("ghost",)),
        StepDef("c", type="teleport"),
        StepDef("d", type="sleep"),
        StepDef("e", task="echo", when={"step": "nobody", "equals": 1}),
        StepDef("f", task="echo", on_failure="missing"),
        StepDef("g", type="task"),
    ]
    problems = dag.validate(steps)
    text = "\n".join(problems)
    for expected in ("duplicate step name 'a'", "unknown step 'ghost'", "unknown type 'teleport'",
                     "sleep step needs 'seconds'", "'when' names unknown step 'nobody'",
                     "on_failure names unknown step 'missing'", "step 'g': 'task' is required"):
        assert expected in text, expected
    assert len(problems) >= 7


def test_cycle_is_named_step_by_step():
    steps = [StepDef("a", task="t", depends_on=("c",)), StepDef("b", task="t", depends_on=("a",)),
             StepDef("c", task="t", depends_on=("b",)), StepDef("d", task="t")]
    problems = dag.validate(steps)
    assert len(problems) == 1 and problems[0].startswith("cycle: ")
    cycle = problems[0].removeprefix("cycle: ").split(" -> ")
    assert cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}


def test_a_cycle_through_a_duplicated_name_is_reported_with_the_duplicate():
    steps = [StepDef("a", task="t", depends_on=("b",)), StepDef("b", task="t", depends_on=("a",)),
             StepDef("a", task="t")]
    problems = dag.validate(steps)
    assert "duplicate step name 'a'" in problems
    assert any(p.startswith("cycle: ") for p in problems), problems


def test_a_when_condition_makes_its_step_a_dependency():
    step = StepDef("b", task="t", when={"step": "a", "path": "x", "equals": "doB"})
    assert step.dependencies() == ("a",)
    cycle = dag.find_cycle([StepDef("a", task="t", depends_on=("b",)), step])
    assert cycle is not None


def test_conditions():
    output = {"a": {"x": "doB", "n": {"k": [1, 2]}}}  # outputs by step name
    assert dag.condition_holds({"step": "a", "path": "x", "equals": "doB"}, output)
    assert not dag.condition_holds({"step": "a", "path": "x", "equals": "doC"}, output)
    assert dag.condition_holds({"step": "a", "path": "x", "not_equals": "doC"}, output)
    assert dag.condition_holds({"step": "a", "path": "x", "in": ["doC", "doB"]}, output)
    assert dag.condition_holds({"step": "a", "path": "n.k.1", "equals": 2}, output)
    assert not dag.condition_holds({"step": "a", "path": "missing.deep", "equals": 1}, output)


def test_compound_conditions_combine_leaves_over_several_steps():
    outputs = {"a": {"x": 1}, "b": {"y": "go"}}
    yes, no = {"step": "a", "path": "x", "equals": 1}, {"step": "b", "path": "y", "equals": "stop"}
    assert dag.condition_holds({"all": [yes, {"not": no}]}, outputs)
    assert not dag.condition_holds({"all": [yes, no]}, outputs)
    assert dag.condition_holds({"any": [no, yes]}, outputs)
    assert not dag.condition_holds({"not": {"any": [yes]}}, outputs)
    step = StepDef("c", task="t", when={"any": [yes, {"not": no}]})
    assert step.dependencies() == ("a", "b")


def test_bad_compound_conditions_and_otherwise_are_all_reported():
    problems = dag.validate([
        StepDef("a", task="t"),
        StepDef("b", task="t", when={"all": []}),
        StepDef("c", task="t", when={"any": [{"step": "ghost", "equals": 1}], "not": {}}),
        StepDef("d", task="t", when={"not": {"step": "a"}}),
        StepDef("e", task="t", when="otherwise"),
    ])
    assert any("'b': 'when'.all must be a non-empty list" in p for p in problems)
    assert any("step 'c'" in p and "exactly one of all, any, not" in p for p in problems)
    assert any("'d': 'when'.not needs exactly one of equals" in p for p in problems)
    assert any("'e': 'when: otherwise' needs depends_on" in p for p in problems)


def test_otherwise_runs_only_when_no_sibling_matched():
    defs = [StepDef("r", task="t"),
            StepDef("b", task="t", when={"step": "r", "path": "route", "equals": "b"}),
            StepDef("c", task="t", when={"step": "r", "path": "route", "in": ["c"]}),
            StepDef("other", task="t", depends_on=("r",), when="otherwise")]
    for route, runs in (("b", {"b"}), ("c", {"c"}), ("z", {"other"})):
        states = _states(defs, {"r": "succeeded"})
        states["r"].output = {"route": route}
        verdict = dag.evaluate(states)
        unblocked = {d.step for d in verdict.decisions if d.event_type == "StepUnblocked"}
        assert unblocked == runs, route


def _states(defs, status=None):
    handlers = dag.handlers_of(defs)
    return {d.name: StepState(d, (status or {}).get(d.name, dag.initial_status(d, handlers)))
            for d in defs}


def test_dead_step_with_successful_handler_does_not_fail_the_workflow():
    defs = [StepDef("a", task="t", on_failure="h"), StepDef("b", task="t", depends_on=("a",)),
            StepDef("h", task="t")]
    states = _states(defs, {"a": "dead", "h": "blocked", "b": "blocked"})
    verdict = dag.evaluate(states)
    assert {(d.step, d.event_type) for d in verdict.decisions} == {
        ("h", "StepUnblocked"), ("b", "Skipped")}
    assert verdict.workflow_event is None
    states["h"].status, states["b"].status = "succeeded", "skipped"
    states["a"].status = "dead"
    assert dag.evaluate(states).workflow_event == "WorkflowSucceeded"
    states["h"].status = "dead"
    assert dag.evaluate(states).workflow_event == "WorkflowFailed"


def test_unused_handler_is_skipped_and_workflow_succeeds():
    defs = [StepDef("a", task="t", on_failure="h"), StepDef("h", task="t")]
    states = _states(defs, {"a": "succeeded"})
    verdict = dag.evaluate(states)
    assert [(d.step, d.event_type) for d in verdict.decisions] == [("h", "Skipped")]
    assert verdict.workflow_event == "WorkflowSucceeded"


@st.composite
def workflows(draw):
    n = draw(st.integers(min_value=1, max_value=9))
    names = [f"s{i}" for i in range(n)]
    defs = []
    handlers: set[str] = set()
    for i, name in enumerate(names):
        if name in handlers:
            defs.append(StepDef(name, task="t"))
            continue
        deps = tuple(sorted(draw(st.sets(st.sampled_from(names[:i]), max_size=3)))) if i else ()
        deps = tuple(d for d in deps if d not in handlers) or ()
        when = None
        if deps and draw(st.booleans()):
            when = {"step": deps[0], "path": "x", "equals": draw(st.sampled_from(["doB", "doC"]))}
        on_failure = None
        later = [m for m in names[i + 1:] if m not in handlers]
        if later and draw(st.integers(0, 3)) == 0:
            on_failure = draw(st.sampled_from(later))
            handlers.add(on_failure)
        defs.append(StepDef(name, task="t", depends_on=deps, when=when, on_failure=on_failure))
    # a handler may not have dependencies: strip any that were drawn before it became one
    defs = [StepDef(d.name, task="t") if d.name in handlers else d for d in defs]
    return defs


@settings(max_examples=300, deadline=None)
@given(defs=workflows(), seed=st.integers(0, 2**32 - 1))
def test_every_workflow_ends_and_steps_unblock_once_after_their_dependencies(defs, seed):
    assert dag.validate(defs) == []
    rng = random.Random(seed)
    states = _states(defs)
    unblocked: list[str] = []
    for _ in range(100):
        verdict = dag.evaluate(states)
        for decision in verdict.decisions:
            state = states[decision.step]
            assert state.status == "blocked"
            if decision.event_type == "StepUnblocked":
                unblocked.append(decision.step)
                handles = [d.name for d in defs if d.on_failure == decision.step]
                if not handles:
                    assert all(states[d].status == "succeeded" for d in state.definition.dependencies())
                state.status = "pending"
            else:
                state.status = "skipped"
        if verdict.workflow_event:
            assert all(s.status in JOB_FINISHED for s in states.values())
            failed = [s for s in states.values() if s.status == "dead"
                      and not (s.definition.on_failure
                               and states[s.definition.on_failure].status == "succeeded")]
            assert (verdict.workflow_event == "WorkflowFailed") == bool(failed)
            break
        runnable = [s for s in states.values() if s.status == "pending"]
        assert runnable, "stuck: nothing runs and the workflow is not over"
        step = rng.choice(runnable)
        if rng.random() < 0.25:
            step.status, step.error = "dead", "boom"
        else:
            step.status, step.output = "succeeded", {"x": rng.choice(["doB", "doC"])}
    else:
        raise AssertionError("workflow never ended")
    assert len(unblocked) == len(set(unblocked)), "a step was unblocked twice"

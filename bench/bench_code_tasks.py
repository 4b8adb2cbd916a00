"""The task module of bench/code_vs_dbos.py: a trivial step and the two workflow shapes."""

import time

import qforge


@qforge.task("bench_step")
def bench_step(payload):
    started = time.time()
    return {"t0": started, "t1": time.time()}


@qforge.workflow("bench_sequential")
def sequential(ctx, _input):
    return [ctx.run("bench_step", {"i": i}) for i in range(10)]


@qforge.workflow("bench_fan_out")
def fan_out(ctx, _input):
    first = ctx.run("bench_step", {"i": 0})
    return [first, ctx.gather(*[ctx.start("bench_step", {"i": i}) for i in range(1, 11)])]

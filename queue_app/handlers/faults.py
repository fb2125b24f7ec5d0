"""Fault injection: wrap a handler so chosen attempts raise, crash, wait or stall.

    from queue_app.handlers import faults
    from queue_app.handlers import registry
    from queue_app.ops import samples

    # One attempt in ten raises, one in twenty kills its worker process, and every
    # attempt first waits 50-200 ms; seed 7 picks which attempts.
    registry.register("email", faults.inject(samples.email, seed=7, error=0.1, crash=0.05, delay=(0.05, 0.2)))

or, without code, ``JOBQUEUE["FAULTS"] = {"email": {"seed": 7, "error": 0.1}}`` (checked
at start-up, applied whenever the kind's handler is looked up: registry.get -> applied()).

Each decision comes from (seed, job id, attempt) through its own ``random.Random``, never
the global generator: the same attempt of the same job meets the same fault in every
process and on every run, and its retry (the next attempt) draws afresh.
``FaultPlan.decide(job_id, attempt)`` tells a test what will happen before it runs.

At most one fault per attempt (the three rates add up to at most 1):

- ``error``: raise ``exception`` (InjectedFault) naming the fault, seed, job and attempt;
- ``crash``: end the process at once with ``os._exit(crash_code)``: to the supervisor it
  looks like a segfault in the handler;
- ``stall``: block in a C-level ``time.sleep(stall_seconds)`` that never yields, so the
  job's timeout kills the process; should the sleep end first, raise.

``delay`` (seconds, or a ``(low, high)`` range) is drawn independently: ``delay_rate`` of
the attempts wait that long before their fault or the handler. ``attempts`` limits all of
it to those attempt numbers: ``crash=1.0, attempts={1}`` crashes every job's first attempt
and lets the retry run clean.
"""

import asyncio
import functools
import inspect
import itertools
import logging
import os
import random
import time
from dataclasses import dataclass, field, replace

from django.core.exceptions import ImproperlyConfigured
from django.tasks import Task
from django.utils.module_loading import import_string

from queue_app.conf import settings
from queue_app.handlers import context as running

log = logging.getLogger("queue_app")

FAULTS = ("error", "crash", "stall")


class InjectedFault(Exception):
    """An error a FaultPlan raised on purpose."""


@dataclass(frozen=True)
class Decision:
    """What one attempt meets."""

    fault: str | None = None  # "error", "crash", "stall", or None: the handler runs
    delay: float = 0.0  # seconds waited before the fault or the handler


@dataclass(frozen=True)
class FaultPlan:
    """Rates and parameters of the faults one wrapped handler injects."""

    seed: int | str = 0
    error: float = 0.0  # fraction of attempts that raise ``exception``
    crash: float = 0.0  # fraction that end their process with os._exit(crash_code)
    stall: float = 0.0  # fraction that block for stall_seconds (past any sane timeout)
    delay: float | tuple[float, float] = 0.0  # seconds, or a (low, high) range
    delay_rate: float = 1.0  # fraction of attempts that wait ``delay``
    attempts: frozenset[int] | None = None  # attempt numbers faults apply to; None: all
    stall_seconds: float = 3600.0
    crash_code: int = 70  # EX_SOFTWARE, as the crashy sample exits
    exception: type[BaseException] = field(default=InjectedFault)

    def __post_init__(self):
        for name in (*FAULTS, "delay_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
                raise ValueError(f"{name} must be a rate between 0 and 1, got {value!r}")
        if sum(getattr(self, name) for name in FAULTS) > 1 + 1e-9:
            raise ValueError("error + crash + stall must not exceed 1: an attempt meets at most one fault")
        low, high = self.delay if isinstance(self.delay, (tuple, list)) else (self.delay, self.delay)
        if not 0 <= low <= high:
            raise ValueError(
                f"delay must be seconds >= 0 or a (low, high) range with low <= high, got {self.delay!r}"
            )
        object.__setattr__(self, "delay", (float(low), float(high)))
        if self.attempts is not None:
            attempts = frozenset([self.attempts] if isinstance(self.attempts, int) else self.attempts)
            if not all(isinstance(a, int) and a >= 1 for a in attempts):
                raise ValueError(f"attempts must be attempt numbers (1, 2, ...), got {self.attempts!r}")
            object.__setattr__(self, "attempts", attempts)
        if self.stall_seconds <= 0:
            raise ValueError(f"stall_seconds must be positive, got {self.stall_seconds!r}")
        if not (isinstance(self.exception, type) and issubclass(self.exception, BaseException)):
            raise ValueError(f"exception must be an exception class, got {self.exception!r}")

    def decide(self, job_id, attempt):
        """Return the Decision for ``attempt`` of job ``job_id``: the same every time."""
        # A string seed goes through SHA-512 in random.seed(): the same stream in every
        # process, whatever PYTHONHASHSEED is. Every draw is always taken, so changing
        # one rate never moves the decisions another rate makes.
        rng = random.Random(f"queue_app.faults:{self.seed}:{job_id}:{attempt}")
        fault_draw, delay_draw, length_draw = rng.random(), rng.random(), rng.random()
        if self.attempts is not None and attempt not in self.attempts:
            return Decision()
        fault, edge = None, 0.0
        for name in FAULTS:
            edge += getattr(self, name)
            if fault_draw < edge:
                fault = name
                break
        low, high = self.delay
        delay = low + (high - low) * length_draw if high > 0 and delay_draw < self.delay_rate else 0.0
        return Decision(fault, delay)

    def describe(self, fault, job_id, attempt):
        return f"injected {fault} (seed={self.seed}, job={job_id}, attempt={attempt})"


def inject(handler, plan=None, **options):
    """Return ``handler`` wrapped to inject the faults of ``plan`` (or FaultPlan(**options)).

    ``handler`` may be a plain or async function (with or without a ``job`` parameter)
    or a django.tasks Task (a Task comes back, its function wrapped).
    """
    if plan is None:
        plan = FaultPlan(**options)
    elif options:
        raise TypeError("give a FaultPlan or its options, not both")
    handler = original(handler)
    if isinstance(handler, Task):
        return replace(handler, func=_wrap(handler.func, plan))
    return _wrap(handler, plan)


def original(handler):
    """The handler inject() wrapped (``handler`` itself if it is not a wrapper)."""
    if isinstance(handler, Task):
        func = getattr(handler.func, "fault_original", None)
        return replace(handler, func=func) if func is not None else handler
    return getattr(handler, "fault_original", handler)


def plan_of(handler):
    """The FaultPlan a wrapped handler (or Task) injects, or None."""
    return getattr(handler.func if isinstance(handler, Task) else handler, "fault_plan", None)


def _wrap(func, plan):
    calls = itertools.count(1)

    def before(kwargs):
        job_id, attempt = _identify(kwargs, calls)
        decision = plan.decide(job_id, attempt)
        return job_id, attempt, decision

    def strike(decision, job_id, attempt):
        if decision.fault is None:
            return
        message = plan.describe(decision.fault, job_id, attempt)
        log.info("fault=%s seed=%s id=%s attempt=%s", decision.fault, plan.seed, job_id, attempt)
        if decision.fault == "crash":
            os._exit(plan.crash_code)
        if decision.fault == "stall":
            time.sleep(plan.stall_seconds)  # C-level and uninterruptible by the handler's thread
            message += f": the {plan.stall_seconds:g}s stall ended before any timeout did"
        raise plan.exception(message)

    # functools.wraps sets __wrapped__, so inspect.signature() (registry.wants_job, Django's
    # validate_task) sees the wrapped function's parameters and callers pass what it takes.
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def wrapper(*args, **kwargs):
            job_id, attempt, decision = before(kwargs)
            if decision.delay:
                await asyncio.sleep(decision.delay)
            strike(decision, job_id, attempt)  # a stall blocks the event loop: that is the point
            return await func(*args, **kwargs)
    else:

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            job_id, attempt, decision = before(kwargs)
            if decision.delay:
                time.sleep(decision.delay)
            strike(decision, job_id, attempt)
            return func(*args, **kwargs)

    wrapper.fault_plan = plan
    wrapper.fault_original = func
    return wrapper


def _identify(kwargs, calls):
    """(job id, attempt) of the running job: the worker's current job, else a ``job``
    argument (a direct call), else (None, n) for the n-th call outside any job. The
    worker's own record first: a Task's function may have a ``job`` parameter of its own."""
    try:
        ctx = running.current_job()
    except LookupError:
        job = kwargs.get("job")
        if job is not None and hasattr(job, "attempts"):
            return job.id, job.attempts
        return None, next(calls)
    return ctx.job_id, ctx.attempt


def configure(specs=None, *, known=()):
    """Check ``JOBQUEUE["FAULTS"]`` (kind -> FaultPlan options; an ``exception`` may be a
    dotted path) at start-up, so a mistake stops the process with a message saying where.
    ``known`` is the kinds registered so far (registry.load_configured_handlers passes them).

    The plans apply when a handler is looked up (registry.get -> applied()), not by
    re-registering: a kind registered later (``runworker --import``, an ``@handler``
    module imported on first use) or registered again is wrapped all the same."""
    for kind in plans(specs):
        if kind not in known and "." not in kind:
            log.warning('JOBQUEUE["FAULTS"] names %r, which no handler is registered for yet', kind)


_plans = (None, {})
_wrapped = {}


def plans(specs=None):
    """{kind: FaultPlan} from ``specs`` (default: the FAULTS setting, parsed once per value)."""
    global _plans
    specs = settings.FAULTS if specs is None else specs
    if _plans[0] is specs:
        return _plans[1]
    built = {}
    for kind, options in (specs or {}).items():
        where = f'JOBQUEUE["FAULTS"][{kind!r}]'
        if not isinstance(options, dict):
            raise ImproperlyConfigured(f"{where} must be a dict of FaultPlan options, got {options!r}")
        try:
            if isinstance(options.get("exception"), str):
                options = {**options, "exception": import_string(options["exception"])}
            built[kind] = FaultPlan(**options)
        except (ImportError, TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"{where}: {exc}") from exc
    _plans = (specs, built)
    return built


def applied(kind, handler):
    """``handler`` wrapped with ``kind``'s FaultPlan from the FAULTS setting, if it has one
    (the same wrapper each time for the same handler and plan)."""
    if not settings.FAULTS:
        return handler
    plan = plans().get(kind)
    if plan is None or plan_of(handler) is plan:
        return handler
    key = (kind, id(handler), id(plan))
    entry = _wrapped.get(key)
    if entry is None or entry[0] is not handler:
        entry = _wrapped[key] = (handler, inject(handler, plan))
    return entry[1]

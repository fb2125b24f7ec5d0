"""Flow control that holds across every worker and host: pauses, concurrency (per kind
and per key) and rate limits.

Pause. A ``Pause`` row names a queue or a kind. Every claim reads the (tiny) table and
hands the names to the claim SQL as exclusions, so paused jobs stay ``pending``, keep
their place in line, and are leased again by the first claim after ``resume``. A pause
takes effect for claims that start after it commits; a job already leased finishes.

How a claim reads them. Usually nothing is paused or limited, and a separate read of
the two tables before every claim would be a round trip of its own for nothing. So
``transitions.claim`` first claims with ``unless_gated``: the engine reads whether any
pause or limit exists in the claim's own statement (PostgreSQL, MariaDB's first one) or
transaction (SQLite) and, if one does, leases nothing; only then does the claim read
claim_gates() and go the long way below. That is exact, not a cache: no claim leases a
job that a pause committed before it started holds back. A process that found a gate
goes the long way directly until a claim_gates() read finds none (likely_gated()), so
a site that keeps a limit pays no extra statement either.

Limits. A ``KindLimit`` row caps one kind: at most ``concurrency`` jobs leased at once,
at most ``per_key`` leased at once per ``Job.concurrency_key`` (see Per key below) and
at most ``rate_limit`` starts per ``rate_period`` seconds. Limited kinds are left out
of the main claim and claimed one kind at a time in their own short transaction:

1. lock the kind's limit row (``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL and
   MariaDB; SQLite's IMMEDIATE transaction already serialises writers);
2. count the kind's leased jobs (the ``(state, kind, queue_name)`` index), per key too
   with ``per_key``, and read the rate window stored on the row;
3. claim at most the slots that are left, with the ordinary index-driven claim;
   with ``per_key``, leaving out the keys that are at their limit (lease_within());
4. add the starts to the window and commit, which releases the lock.

Why a count under a lock and not a semaphore table of held slots: the leased rows
*are* the truth. A semaphore must be given back by whoever holds it, so a worker that
dies (or a lease that is recovered, cancelled or completed by another path) would
leak a slot until something reconciled it. Counting ``state='leased'`` frees the slot
the moment the job leaves ``leased`` by any edge, including lease recovery, with no
bookkeeping in complete/fail/recover. The count is an index range of at most
``concurrency`` rows, so it costs what a semaphore read would. The lock is what makes
the count safe: two claimers cannot both see one free slot, because the second one
waits for (PostgreSQL/MariaDB: skips) the first one's commit, and under READ COMMITTED
its count then includes the first one's leases.

SKIP LOCKED on the limit row: a worker that finds the row locked skips that kind for
this claim instead of queueing behind it; the worker holding the lock is taking that
kind's free slots anyway. So a hot limited kind never serialises the whole cluster.

Order: limited kinds are claimed before the main claim fills the rest of the batch,
so a large unlimited backlog cannot starve them (they are bounded by their slots
anyway). Within a batch, the global priority order therefore holds per group (each
limited kind, then everything else), not across groups.

Per key ("one job per customer at a time", as Oban Pro's partitioned limits and
Sidekiq Enterprise's limiters offer). With ``per_key`` set, a job whose
``concurrency_key`` already has ``per_key`` leased jobs of its kind waits; jobs of
other keys lease past it, and jobs without a key are held only by ``concurrency``. It
is the same rule as the kind's: a count of ``state='leased'`` rows, grouped by key,
under the same row lock, so it holds across every worker and host and a dead worker's
slot frees when its lease is recovered, with nothing to give back. The keys at their
limit go to the claim as exclusions (``Engine.claim(exclude_keys=...)``), so the seek
steps over their waiting jobs instead of taking and returning them. One claim must not
take more than ``per_key`` of one key either: it leases in rounds, each asking for no
more jobs than the key with the least room has left (any round might take them all
from that key), counting what it took per key and excluding a key once it is full. At
``per_key=1`` that is one job per round, one round trip each: a claim of a per-key
kind costs as many statements as it leases jobs. The grouped count reads the kind's
leased rows through the ``(state, kind, queue_name)`` index: no more than the kind has
running, so ``concurrency_key`` needs no index of its own.

Fair share ("one tenant's burst must not starve the others", as Oban Pro's and
BullMQ Pro's group rotation offer). A ``KindLimit`` row with ``fair`` makes its kind's
concurrency keys tenants that take turns; jobs without a key are one more tenant. It is
claimed in the same short transaction under the same row lock as a limited kind (the
free slots from reserve() are the batch), with its own statement (Engine.claim_fair,
the same SET, claimed events and SKIP LOCKED as every claim). What one claim guarantees:

* rounds: round 1 is each tenant's best ready job (its best N with a weight N in
  ``fair_weights``; a key not named there, and the keyless tenant, weigh 1), round 2
  the next ones, and so on, each tenant's jobs in the usual lease order (priority,
  aging, run_at, created_at, id); the batch is the first ``free`` jobs of (round, turn);
* turns: the cycle is the keyless tenant, then the keys in ascending order, resumed just
  after ``fair_after``, the tenant the previous claim of the kind served last (written
  under the row lock, so one cycle for every worker and host);
* hence a tenant with a ready job is leased within ceil(T / batch) claims of its kind,
  T the kind's tenants with pending jobs, whatever the other tenants' backlogs; with
  T <= batch, in every batch.

Not promised: an order across tenants by priority (that is what fair gives up). The tenants are the keys of *pending* jobs (a loose index scan of
jq_ready_tenant, fair_tenants()), so a tenant whose jobs are all scheduled, or in queues
this worker does not serve, takes its turn and gives nothing. A claim reads at most
``free`` tenants and seeks each tenant's share of the batch per priority level; when
some tenants run out, the rounds go on among the others (lease_fair()). ``per_key`` and
``fair`` do not combine (per_key already leases keys in rounds): set_limit refuses it.

The rate limit is a fixed window per kind: the row holds the window's start and its
starts so far; a claim after ``window_start + rate_period`` opens a new window. Like
every fixed window it can admit up to twice the rate across a window boundary over a
period-long span; the count over whole windows is exact.
"""

import random
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

from django.db import connections, transaction
from django.utils import timezone

from queue_app import engines
from queue_app.conf import settings
from queue_app.core import validation
from queue_app.exceptions import InvalidJob
from queue_app.models import KIND_MAX_LENGTH, Job, KindLimit, Pause, PauseScope, State

_UNSET = object()


@dataclass(frozen=True)
class Pauses:
    queues: frozenset = frozenset()
    kinds: frozenset = frozenset()


# --- pause / resume --------------------------------------------------------------------


def current_pauses(using="default"):
    """Return what is paused now (one query on a table of a few rows)."""
    queues, kinds = set(), set()
    for scope, name in Pause.objects.using(using).values_list("scope", "name"):
        (queues if scope == PauseScope.QUEUE else kinds).add(name)
    return Pauses(frozenset(queues), frozenset(kinds))


# Per database: whether this process's last claim_gates() read found a pause or a
# limit. Only which way transitions.claim tries first; each way reads the gates itself.
_seen_gated = {}


def likely_gated(using="default"):
    """Whether the last claim here found something paused or limited."""
    return _seen_gated.get(using, False)


def claim_gates(using="default"):
    """Return (Pauses, limited kinds): what a claim must know, read in one statement.

    The same rows as current_pauses() and active_limits(), without building a model per
    row: a claim that may meet a gate reads this each time (no cache, so a pause or a
    limit set on any host holds from the next claim on), so it has to cost one small
    round trip."""
    rows = engines.of(connections[using]).claim_gates()
    _seen_gated[using] = bool(rows)
    queues = frozenset(name for scope, name in rows if scope == PauseScope.QUEUE)
    kinds = frozenset(name for scope, name in rows if scope == PauseScope.KIND)
    limited = frozenset(name for scope, name in rows if scope == "limit")
    return Pauses(queues, kinds), limited


def _scope(queue, kind):
    if (queue is None) == (kind is None):
        raise InvalidJob("name a queue or a kind (exactly one)", "queue")
    if queue is not None:
        return PauseScope.QUEUE, validation.name(queue, "queue", KIND_MAX_LENGTH)
    return PauseScope.KIND, validation.name(kind, "kind", KIND_MAX_LENGTH)


def pause(*, queue=None, kind=None, actor="", reason="", using="default"):
    """Pause a queue or a kind cluster-wide; return (Pause, created)."""
    scope, name = _scope(queue, kind)
    with transaction.atomic(using=using):
        return Pause.objects.using(using).get_or_create(
            scope=scope, name=name, defaults={"actor": actor or "", "reason": reason or ""}
        )


def resume(*, queue=None, kind=None, using="default"):
    """Resume a paused queue or kind; return True if it was paused."""
    scope, name = _scope(queue, kind)
    deleted, _ = Pause.objects.using(using).filter(scope=scope, name=name).delete()
    return bool(deleted)


def paused_counts(using="default"):
    """Return [(Pause, pending jobs it holds back)] for the dashboard and `pause --list`."""
    out = []
    for p in Pause.objects.using(using).all():
        field = "queue_name" if p.scope == PauseScope.QUEUE else "kind"
        out.append((p, Job.objects.using(using).filter(state=State.PENDING, **{field: p.name}).count()))
    return out


# --- limits ------------------------------------------------------------------------------


def _positive_int(value, field):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidJob(f"{field} must be a positive integer or empty, got {value!r}", field)
    return value


def set_limit(
    kind,
    *,
    concurrency=_UNSET,
    per_key=_UNSET,
    rate_limit=_UNSET,
    rate_period=_UNSET,
    fair=_UNSET,
    fair_weights=_UNSET,
    from_settings=False,
    using="default",
):
    """Create or change a kind's limits; None clears one. Return the KindLimit."""
    kind = validation.name(kind, "kind", KIND_MAX_LENGTH)
    changes = {"updated_at": timezone.now(), "from_settings": from_settings}
    if concurrency is not _UNSET:
        changes["concurrency"] = _positive_int(concurrency, "concurrency")
    if per_key is not _UNSET:
        changes["per_key"] = _positive_int(per_key, "per_key")
    if rate_limit is not _UNSET:
        changes["rate_limit"] = _positive_int(rate_limit, "rate_limit")
    if rate_period is not _UNSET:
        changes["rate_period"] = validation.seconds(rate_period, "rate_period", maximum=366 * 86400)
    if fair is not _UNSET:
        if not isinstance(fair, bool):
            raise InvalidJob(f"fair must be true or false, got {fair!r}", "fair")
        changes["fair"] = fair
    if fair_weights is not _UNSET:
        changes["fair_weights"] = weights(fair_weights)
    with transaction.atomic(using=using):
        limit, _ = (
            KindLimit.objects.using(using).select_for_update().get_or_create(kind=kind, defaults=changes)
        )
        for field, value in changes.items():
            setattr(limit, field, value)
        if limit.fair and limit.per_key is not None:
            raise InvalidJob(
                "fair and per_key do not combine: per_key already leases keys in rounds "
                "(per_key 1 is one job per key at a time); clear one of them",
                "fair",
            )
        limit.save(using=using)
    return limit


def weights(value):
    """A fair kind's weights, {concurrency key: jobs per round}, checked; None is {}."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidJob(f'fair_weights must be an object like {{"key": 3}}, got {value!r}', "fair_weights")
    for key, weight in value.items():
        validation.concurrency_key(key)
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 1000:
            raise InvalidJob(
                f"fair_weights[{key!r}] must be an integer from 1 to 1000, got {weight!r}", "fair_weights"
            )
    return dict(value)


def clear_limit(kind, *, using="default"):
    """Remove a kind's limits; return True if it had any."""
    deleted, _ = KindLimit.objects.using(using).filter(kind=kind).delete()
    return bool(deleted)


def sync_limits(using="default"):
    """Copy the LIMITS setting into KindLimit rows; return the kinds written.

    Rows edited at runtime are overwritten only for kinds the setting names; a row
    that came from the setting and no longer appears there is removed.
    """
    configured = settings.LIMITS or {}
    for kind, spec in configured.items():
        unknown = set(spec) - {"concurrency", "per_key", "rate_limit", "rate_period", "fair", "fair_weights"}
        if unknown:
            raise InvalidJob(f"LIMITS[{kind!r}]: unknown key(s) {sorted(unknown)}", "LIMITS")
        set_limit(
            kind,
            concurrency=spec.get("concurrency"),
            per_key=spec.get("per_key"),
            rate_limit=spec.get("rate_limit"),
            rate_period=spec.get("rate_period", 60.0),
            fair=spec.get("fair", False),
            fair_weights=spec.get("fair_weights", {}),
            from_settings=True,
            using=using,
        )
    KindLimit.objects.using(using).filter(from_settings=True).exclude(kind__in=list(configured)).delete()
    return sorted(configured)


def active_limits(using="default"):
    """Return {kind: KindLimit} for kinds that have a limit set."""
    return {
        limit.kind: limit
        for limit in KindLimit.objects.using(using).all()
        if limit.concurrency is not None
        or limit.rate_limit is not None
        or limit.per_key is not None
        or limit.fair
    }


def kinds_to_claim(limits, kinds, pauses):
    """The limited kinds a claim should try, in a random order (fair between kinds)."""
    wanted = [k for k in limits if k not in pauses.kinds and (not kinds or k in kinds)]
    random.shuffle(wanted)
    return wanted


def reserve(kind, want, now, *, using="default"):
    """Lock ``kind``'s limit row and return (row, slots free now, at most ``want``).

    Must run inside the claim's transaction: the lock is held until it commits. Returns
    (None, 0) when another claimer holds the row (it is taking the free slots) or the
    limit was removed since it was read.
    """
    qs = KindLimit.objects.using(using).filter(kind=kind)
    if connections[using].features.has_select_for_update_skip_locked:
        qs = qs.select_for_update(skip_locked=True)
    else:
        qs = qs.select_for_update()
    row = qs.first()
    if row is None:
        return None, 0
    free = want
    if row.concurrency is not None:
        leased = Job.objects.using(using).filter(state=State.LEASED, kind=kind).count()
        free = min(free, row.concurrency - leased)
    if row.rate_limit is not None:
        if row.window_start is None or now >= row.window_start + timedelta(seconds=row.rate_period):
            row.window_start, row.window_count = now, 0
        free = min(free, row.rate_limit - row.window_count)
    return row, max(0, free)


def leased_per_key(kind, *, using="default"):
    """Return {concurrency_key: leased jobs} for ``kind``'s leased jobs that have a key."""
    return engines.of(connections[using]).leased_per_key(kind)


def lease_within(row, free, lease, *, using="default"):
    """Lease up to ``free`` jobs of ``row``'s kind with ``lease(n, exclude_keys=...)``,
    keeping every concurrency key within ``row.per_key``; return the jobs.

    Runs under the reserve() lock, so the per-key counts read here stay true until the
    claim commits (the module docstring says why rounds)."""
    if row.per_key is None:
        return lease(free)
    held = leased_per_key(row.kind, using=using)
    jobs = []
    while len(jobs) < free:
        full = {key for key, n in held.items() if n >= row.per_key}
        room = [row.per_key - n for n in held.values() if n < row.per_key]
        want = min(free - len(jobs), row.per_key, *room)
        got = lease(want, exclude_keys=full)
        jobs += got
        held.update(job.concurrency_key for job in got if job.concurrency_key is not None)
        if len(got) < want:
            break  # nothing more is claimable now
    return jobs


def fair_tenants(row, n, *, using="default"):
    """The next ``n`` (at most) tenants of ``row``'s fair kind, in the order a fair claim
    serves them: the cycle (keyless jobs, then the keys in order) resumed just after
    ``row.fair_after`` and wrapped around. Tenants are the keys of pending jobs, read
    by a loose index scan (Engine.fair_keys): as many seeks as tenants returned."""
    engine = engines.of(connections[using])
    keyless = engine.fair_keyless(row.kind)
    after = row.fair_after
    if after is None:
        tenants = [None] if keyless else []
        return tenants + engine.fair_keys(row.kind, n - len(tenants))
    tenants = engine.fair_keys(row.kind, n, after=after or None)
    if len(tenants) < n and keyless:
        tenants.append(None)
    if after and len(tenants) < n:
        tenants += engine.fair_keys(row.kind, n - len(tenants), upto=after)
    return tenants[:n]


def lease_fair(row, free, lease, *, using="default"):
    """Lease up to ``free`` jobs of ``row``'s fair kind with ``lease(tenants, weights, n)``
    round-robin over its tenants, and move the kind's place in the cycle to the last
    tenant served; return the jobs.

    Runs under the reserve() lock, so one claim at a time moves the place, cluster-wide."""
    tenants = fair_tenants(row, free, using=using)
    weight = {key: row.fair_weights.get(key, 1) if key is not None else 1 for key in tenants}

    def rounds(counts, tenant):
        return -(-counts[tenant] // weight[tenant])  # the rounds this tenant's jobs took

    jobs, asked = [], tenants
    while asked and len(jobs) < free:
        got = lease(asked, [weight[t] for t in asked], free - len(jobs))
        if not got:
            break
        jobs += got
        # A claim seeks only each tenant's share of the batch (Engine.fair_scan): when
        # some ran out, the rest of the batch goes on in rounds among those that may
        # have more, the ones that filled the most rounds.
        per_tenant = Counter(job.concurrency_key for job in got)
        most = max(rounds(per_tenant, t) for t in asked)
        asked = [t for t in asked if rounds(per_tenant, t) == most]
    if jobs:
        # The last job in lease order is in the last round, from the last of the
        # tenants that had a job in it.
        got = Counter(job.concurrency_key for job in jobs)
        last_round = max(rounds(got, t) for t in tenants)
        last = [t for t in tenants if rounds(got, t) == last_round][-1]
        row.fair_after = "" if last is None else last
        KindLimit.objects.using(using).filter(kind=row.kind).update(fair_after=row.fair_after)
    return jobs


def record_starts(row, started, now, *, using="default"):
    """Add ``started`` claims to the row's rate window (under the reserve() lock)."""
    if row.rate_limit is None or not started:
        return
    KindLimit.objects.using(using).filter(kind=row.kind).update(
        window_start=row.window_start, window_count=row.window_count + started
    )


def limit_status(using="default"):
    """Return [(KindLimit, leased now, starts in the current window, keys at their
    per_key limit now (None without per_key))] for display."""
    now = timezone.now()
    out = []
    for row in KindLimit.objects.using(using).all():
        leased = Job.objects.using(using).filter(state=State.LEASED, kind=row.kind).count()
        in_window = 0
        if row.window_start is not None and now < row.window_start + timedelta(seconds=row.rate_period):
            in_window = row.window_count
        full = None
        if row.per_key is not None:
            full = sum(1 for n in leased_per_key(row.kind, using=using).values() if n >= row.per_key)
        out.append((row, leased, in_window, full))
    return out

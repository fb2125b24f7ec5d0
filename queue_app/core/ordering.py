"""The lease order, as plain Python: the rule the claim SQL implements per vendor.

Ready jobs (pending, run_at <= now) lease by effective priority (higher first), then
run_at, created_at and id. With aging on, a job earns one point per full aging
interval it has waited since it became ready (run_at), so a scheduled job starts
aging only once its time has come. Ages are whole microseconds so that this model and
the database agree exactly at interval boundaries.
"""

from datetime import timedelta

_US = timedelta(microseconds=1)


def aging_microseconds(aging_seconds):
    return round(float(aging_seconds or 0) * 1_000_000)


def effective_priority(priority, run_at, now, aging_seconds):
    """Return ``priority`` plus one per full aging interval waited since ``run_at``."""
    aging_us = aging_microseconds(aging_seconds)
    if aging_us <= 0 or run_at > now:
        return priority
    return priority + (now - run_at) // _US // aging_us


def sort_key(job, now, aging_seconds):
    """Key that sorts ready jobs into lease order."""
    return (
        -effective_priority(job.priority, job.run_at, now, aging_seconds),
        job.run_at,
        job.created_at,
        job.id,
    )


def lease_order(jobs, now, aging_seconds):
    """Return the ready jobs among ``jobs`` in the order they would be leased."""
    ready = [j for j in jobs if j.state == "pending" and j.run_at <= now]
    return sorted(ready, key=lambda j: sort_key(j, now, aging_seconds))

"""Filters the dashboard templates use to show numbers, ages and JSON."""

from django import template

from queue_app.core import durations
from queue_app.ops import dashboard

register = template.Library()


@register.filter
def num(value):
    """1234567 -> 1,234,567 (no locale machinery, no humanize app)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return value


@register.filter
def age(value, now=None):
    return dashboard.age(value, now)


@register.filter
def took(value):
    """A timedelta (or seconds) as 850ms, 12.3s, 4m05s; empty for none."""
    if value is None or value == "":
        return ""
    seconds = value.total_seconds() if hasattr(value, "total_seconds") else float(value)
    return durations.format(max(0.0, seconds))


@register.filter
def rate(per_minute):
    """Events per minute in words that keep a trickle visible: 12/min, 1.5/min, 3/h, 0."""
    if not per_minute:
        return "0"
    if per_minute >= 10:
        return f"{per_minute:,.0f}/min"
    if per_minute >= 1:
        return f"{per_minute:.1f}/min"
    return f"{per_minute * 60:.0f}/h" if per_minute * 60 >= 1 else "<1/h"


@register.filter
def label(name):
    """A state, status or event name as words: dead_letter -> dead letter."""
    return str(name).replace("_", " ")


@register.filter
def user_traceback(text):
    return dashboard.user_traceback(text)


@register.filter
def pretty_json(value):
    return dashboard.json_text(value)


@register.filter
def get(mapping, key):
    return mapping.get(key, "") if hasattr(mapping, "get") else ""

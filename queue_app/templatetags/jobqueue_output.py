"""Template filters for a job attempt's captured output (capture.py)."""

from django import template

from queue_app.worker import capture

register = template.Library()


@register.filter
def output_streams(metadata):
    """An event's captured output as [(stream, text, bytes dropped)]; [] if none."""
    return capture.streams((metadata or {}).get("output") if isinstance(metadata, dict) else None)

"""PostgreSQL: the job table's indexes on parent, group and the idempotency key's LIKE
index hold only non-NULL values (engines/schema.py says why); nothing changes elsewhere."""

from django.db import migrations

from queue_app.engines import schema


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0028_worker_threads_and_flow_rollup"),
    ]

    operations = [
        migrations.RunPython(schema.partial_not_null_indexes_0029, schema.full_indexes_0029, elidable=False),
    ]

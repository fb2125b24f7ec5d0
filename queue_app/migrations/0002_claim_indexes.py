"""The claim query's indexes, per vendor (see leasing.py for the query they serve).

PostgreSQL and SQLite get partial indexes over pending (and leased) rows only, so
completed history costs them nothing. MariaDB has no partial indexes: the same
columns lead with ``state`` instead. Django's Meta.indexes cannot say "partial here,
prefixed there", hence SQL.
"""
from django.db import migrations

PARTIAL = [
    ("jq_ready_prio", "(priority, run_at, created_at, id) WHERE state = 'pending'"),
    ("jq_ready_queue", "(queue_name, priority, run_at, created_at, id) WHERE state = 'pending'"),
    ("jq_lease_expiry", "(lease_expires_at) WHERE state = 'leased'"),
]
PREFIXED = [
    ("jq_ready_prio", "(state, priority, run_at, created_at, id)"),
    ("jq_ready_queue", "(state, queue_name, priority, run_at, created_at, id)"),
    ("jq_lease_expiry", "(state, lease_expires_at)"),
]


def create(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for name, cols in PREFIXED if vendor == "mysql" else PARTIAL:
        schema_editor.execute(f"CREATE INDEX {name} ON queue_app_job {cols}")


def drop(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for name, _ in PARTIAL:
        if vendor == "mysql":
            schema_editor.execute(f"DROP INDEX {name} ON queue_app_job")
        else:
            schema_editor.execute(f"DROP INDEX {name}")


class Migration(migrations.Migration):
    atomic = False  # MariaDB cannot run DDL inside a transaction
    dependencies = [("queue_app", "0001_initial")]
    operations = [migrations.RunPython(create, drop)]

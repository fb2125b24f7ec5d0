"""Idempotency and concurrency keys are exact strings on every database.

MariaDB compares strings by the column's collation, utf8mb4_general_ci here: "Key",
"key" and "key " are one value to it. Two different idempotency keys would then dedupe
to one job, and a per-key limit would count two keys as one, while PostgreSQL and
SQLite tell them apart. utf8mb4_nopad_bin compares the bytes, trailing spaces included
(utf8mb4_bin still pads). Django's db_collation takes a vendor's collation name, so, as
in 0002, this is SQL for MariaDB alone.
"""
from django.db import migrations

COLUMNS = ("idempotency_key", "concurrency_key")


def collate(name):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "mysql":
            return
        changes = ", ".join(f"MODIFY {column} varchar(255) COLLATE {name} NULL" for column in COLUMNS)
        schema_editor.execute(f"ALTER TABLE queue_app_job {changes}")

    return run


class Migration(migrations.Migration):
    atomic = False  # MariaDB cannot run DDL inside a transaction
    dependencies = [("queue_app", "0009_job_concurrency_key")]
    operations = [migrations.RunPython(collate("utf8mb4_nopad_bin"), collate("utf8mb4_general_ci"))]

"""Idempotency and concurrency keys are exact strings on every database: on MariaDB the two
columns collate as bytes (utf8mb4_nopad_bin). Django's db_collation takes one vendor's
collation name, so, as in 0002, the SQL is MariaDB's alone and lives in engines/schema.py.
"""

from django.db import migrations

from queue_app.engines.schema import collate_keys_0010


class Migration(migrations.Migration):
    atomic = False  # MariaDB cannot run DDL inside a transaction
    dependencies = [("queue_app", "0009_job_concurrency_key")]
    operations = [
        migrations.RunPython(collate_keys_0010("utf8mb4_nopad_bin"), collate_keys_0010("utf8mb4_general_ci"))
    ]

"""The claim query's indexes, per vendor: partial where the database has them, prefixed with
``state`` on MariaDB. Django's Meta.indexes cannot say "partial here, prefixed there", so the
SQL lives with the other vendor SQL in engines/schema.py.
"""

from django.db import migrations

from queue_app.engines.schema import create_claim_indexes_0002, drop_claim_indexes_0002


class Migration(migrations.Migration):
    atomic = False  # MariaDB cannot run DDL inside a transaction
    dependencies = [("queue_app", "0001_initial")]
    operations = [migrations.RunPython(create_claim_indexes_0002, drop_claim_indexes_0002)]

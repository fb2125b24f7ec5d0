"""Fair share between tenants: KindLimit.fair and its round-robin position, and the fair
claim's index (its SQL, per vendor, lives in engines/schema.py as 0002's does)."""

from django.db import migrations, models

from queue_app.engines import schema


class Migration(migrations.Migration):
    atomic = False  # MariaDB cannot run DDL inside a transaction
    dependencies = [
        ("queue_app", "0026_metrics_counts"),
    ]

    operations = [
        migrations.AddField(
            model_name="kindlimit",
            name="fair",
            field=models.BooleanField(
                default=False, help_text="Lease the kind's concurrency keys (tenants) round-robin."
            ),
        ),
        migrations.AddField(
            model_name="kindlimit",
            name="fair_after",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="kindlimit",
            name="fair_weights",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text='Fair share: {"key": N} leases N of that key\'s jobs per round; others 1.',
            ),
        ),
        migrations.RunPython(schema.create_fair_index_0025, schema.drop_fair_index_0025, elidable=False),
    ]

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0010_exact_keys_on_mariadb"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="run_after",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]

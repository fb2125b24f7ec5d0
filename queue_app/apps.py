from django.apps import AppConfig


class QueueAppConfig(AppConfig):
    name = "queue_app"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from queue_app import checks  # noqa: F401  (registers the system checks)
        from queue_app.conf import settings
        from queue_app.core import runtime, validation, webhooks
        from queue_app.handlers import registry
        from queue_app.worker import shell

        registry.register(webhooks.KIND, webhooks.deliver)
        # Refuses to run unless SHELL_JOBS is on where the worker runs.
        registry.register(validation.SHELL_KIND, shell.run)
        registry.load_configured_handlers()
        # Runtime settings (manage.py config) override JOBQUEUE's from the database.
        settings.use_store(runtime.load)

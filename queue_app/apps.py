from django.apps import AppConfig


class QueueAppConfig(AppConfig):
    name = "queue_app"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from queue_app import checks  # noqa: F401  (registers the system checks)
        from queue_app.core import webhooks
        from queue_app.handlers import registry

        registry.register(webhooks.KIND, webhooks.deliver)
        registry.load_configured_handlers()

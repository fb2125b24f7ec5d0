from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from queue_app.web.api import api
from queue_app.web.health import health_view
from queue_app.web.metrics_http import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("metrics", metrics_view, name="metrics"),
    path("health", health_view, name="health"),
    path("dashboard/", include("queue_app.web.urls")),
    path("", RedirectView.as_view(pattern_name="queue_app_dashboard:overview", permanent=False)),
]

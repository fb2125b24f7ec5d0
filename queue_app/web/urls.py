from django.urls import path

from queue_app.web import views

app_name = "queue_app_dashboard"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/bulk/", views.bulk, name="bulk"),
    path("jobs/<int:job_id>/", views.job, name="job"),
    path("jobs/<int:job_id>/workflow/", views.workflow, name="workflow"),
    path("jobs/<int:job_id>/<slug:action>/", views.job_action, name="job_action"),
    path("dead-letters/", views.dead_letters, name="dead_letters"),
    path("running/", views.running, name="running"),
    path("workers/", views.workers, name="workers"),
    path("workers/<int:worker_id>/stop/", views.worker_stop, name="worker_stop"),
    path("workers/<int:worker_id>/quiet/", views.worker_quiet, name="worker_quiet"),
    path("queues/", views.queues, name="queues"),
    path("schedules/", views.schedules, name="schedules"),
    path("schedules/<str:name>/run/", views.schedule_run_now, name="schedule_run_now"),
    path("schedules/<str:name>/enabled/", views.schedule_enable, name="schedule_enable"),
    path("queues/pause/", views.pause, name="pause"),
    path("queues/resume/", views.resume, name="resume"),
]

"""`manage.py web` serves the site's own WSGI application, not the example project's."""

from queue_app.management.commands.web import gunicorn_argv


def test_web_serves_the_wsgi_application_the_settings_name(settings):
    settings.WSGI_APPLICATION = "mysite.wsgi.app"

    argv = gunicorn_argv(":8000")

    assert "mysite.wsgi:app" in argv
    assert not any("jobqueue_project" in arg for arg in argv)


def test_web_serves_the_example_project_by_default():
    assert "jobqueue_project.wsgi:application" in gunicorn_argv("127.0.0.1:8000")

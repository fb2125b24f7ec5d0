"""Settings for the example project, read from the environment with django-environ.

DATABASE_URL picks the store: sqlite:///queue.db (default), postgres://..., mysql://...
"""

import logging
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, False),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "[::1]"]),
)
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env("DEBUG")
# No default from the repository: a key everyone can read signs sessions anyone can forge.
# With DEBUG off and none set it stays empty, and every entry point that serves or signs
# (web, runworker, metrics --addr) refuses to start saying how to set it
# (queue_app.conf.missing_secret_key); with DEBUG on each process makes a throwaway one.
SECRET_KEY = env("SECRET_KEY", default="")
if not SECRET_KEY and DEBUG:
    import sys

    from django.core.management.utils import get_random_secret_key

    SECRET_KEY = get_random_secret_key()
    print(
        "DEBUG: SECRET_KEY is not set; this process uses a throwaway key (sessions end with it)",
        file=sys.stderr,
    )
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

# Behind TLS (`manage.py check --deploy` is clean once these are set): secure cookies, HSTS,
# the redirect to https, and the header a TLS-terminating proxy sets (e.g.
# SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https). Off by default: plain http on
# localhost is the demo's and the tests' setting.
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SECURE_PROXY_SSL_HEADER = tuple(env.list("SECURE_PROXY_SSL_HEADER", default=[])) or None
if SECURE_PROXY_SSL_HEADER is not None and len(SECURE_PROXY_SSL_HEADER) != 2:
    raise ImproperlyConfigured(
        "SECURE_PROXY_SSL_HEADER must be HEADER,VALUE (e.g. HTTP_X_FORWARDED_PROTO,https)"
    )
# Django's own cap on a request body is below the API's (API_MAX_BODY_BYTES, 4 MiB): a body
# between the two got Django's HTML 400 instead of the API's JSON 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Only for its templates and static files: /api/docs then loads Swagger UI from here,
    # not from a CDN.
    "ninja",
    "queue_app",
    # Login throttling for the admin's login, the way into the dashboard and the API's
    # session auth too (django-axes).
    "axes",
]

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username from an address before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Locked after AXES_FAILURE_LIMIT wrong passwords for one username from one address, for
# AXES_COOLOFF_HOURS; `manage.py axes_reset` lifts every lock at once.
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = env.float("AXES_COOLOFF_HOURS", default=1.0)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# How many reverse proxies in front append to X-Forwarded-For: the lockout then counts the
# client's address, not the proxy's (queue_app.web.clients). 0: the header is ignored.
TRUSTED_PROXIES = env.int("TRUSTED_PROXIES", default=0)
AXES_CLIENT_IP_CALLABLE = "queue_app.web.clients.client_ip"

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves collected static files from gunicorn, compressed and with cache headers.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A Content-Security-Policy on every page: the dashboard loads only its own static
    # files (no inline script, nothing from a CDN), so an injected tag could run nothing.
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes asks: it turns a lockout into its 429 answer.
    "axes.middleware.AxesMiddleware",
]

CONTENT_SECURITY_POLICY = {
    # Swagger UI (/api/docs) starts itself with an inline script: that page only goes without.
    "EXCLUDE_URL_PREFIXES": ["/api/docs"],
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        # The admin sets a few style attributes; styles cannot run code.
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'"],
    },
}

ROOT_URLCONF = "jobqueue_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "jobqueue_project.wsgi.application"


def _database(url):
    db = environ.Env.db_url_config(url)
    engine = db["ENGINE"]
    options = db.setdefault("OPTIONS", {})
    if engine.endswith("sqlite3"):
        # Several worker processes share one file: WAL lets readers run beside the
        # writer, IMMEDIATE takes the write lock at BEGIN so a claim never has to
        # upgrade a read lock (the cause of SQLITE_BUSY deadlocks), and the timeout
        # makes writers queue instead of failing.
        options.setdefault("transaction_mode", "IMMEDIATE")
        options.setdefault("timeout", 30)
        # synchronous=NORMAL (the default here, as Rails ships it): a commit survives a
        # crash of any process, but the last ones may roll back if the machine loses
        # power; FULL syncs every commit and survives that too, at about half the
        # single-enqueue rate. PostgreSQL and MariaDB always sync commits.
        synchronous = env("SQLITE_SYNCHRONOUS", default="NORMAL").upper()
        if synchronous not in ("NORMAL", "FULL", "EXTRA"):
            raise ImproperlyConfigured(
                f"SQLITE_SYNCHRONOUS must be NORMAL, FULL or EXTRA, not {synchronous!r}"
            )
        options.setdefault(
            "init_command",
            f"PRAGMA journal_mode=WAL; PRAGMA synchronous={synchronous}; PRAGMA busy_timeout=30000;",
        )
        name = str(db.get("NAME") or "queue.db")
        if name != ":memory:" and not Path(name).is_absolute():
            name = str(BASE_DIR / name)
        db["NAME"] = name
        db["TEST"] = {"NAME": env("SQLITE_TEST_NAME", default=str(BASE_DIR / "test_queue.db"))}
    elif engine.endswith("mysql"):
        options.setdefault("charset", "utf8mb4")
        # READ COMMITTED: a claim must see rows committed by other workers, and
        # gap locks from REPEATABLE READ would serialise concurrent claims.
        options.setdefault("isolation_level", "read committed")
    db.setdefault("CONN_MAX_AGE", 0)
    return db


DATABASES = {"default": _database(env("DATABASE_URL", default="sqlite:///queue.db"))}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Not the manifest variant: that one fails every page until collectstatic has run.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# django.tasks: @task functions run on our workers (queue_app/tasks/backend.py).
TASKS = {"default": {"BACKEND": "queue_app.backends.DatabaseBackend"}}

# The queue's own knobs; every key is optional (defaults in queue_app/conf.py).
JOBQUEUE = {
    "LEASE_SECONDS": env.float("JOBQUEUE_LEASE_SECONDS", default=30.0),
    "AGING_INTERVAL": env.float("JOBQUEUE_AGING_INTERVAL", default=30.0),
    "DEFAULT_MAX_ATTEMPTS": env.int("JOBQUEUE_DEFAULT_MAX_ATTEMPTS", default=3),
    # JOBQUEUE_SAMPLE_HANDLERS=1 registers the bundled sample workloads (email, report,
    # flaky, slow, webhook, crashy), so `enqueue --kind email` then `runworker`
    # works by hand; `manage.py demo` and the tests turn it on themselves. Never in
    # production: any API writer could crash or tie up the workers with them.
    "SAMPLE_HANDLERS": env.bool("JOBQUEUE_SAMPLE_HANDLERS", default=False),
    # Where a django.tasks kind may be imported from (comma-separated); unset: the
    # installed apps' and the project's packages.
    "TASK_MODULES": env.list("JOBQUEUE_TASK_MODULES", default=None),
    # `enqueue --command` / the "shell" kind run shell commands on the workers.
    "SHELL_JOBS": env.bool("JOBQUEUE_SHELL_JOBS", default=False),
    # JOBQUEUE_POSTGRES_PREPARE=0 behind a pooler that cannot keep prepared statements.
    "POSTGRES_PREPARE": env.bool("JOBQUEUE_POSTGRES_PREPARE", default=True),
}

# LOG_FORMAT=json: one JSON object a line (python-json-logger), with the job's fields
# (queue_app.core.telemetry.JobFields) on every line of the worker and the transitions.
LOG_FORMAT = env("LOG_FORMAT", default="plain")
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be plain or json, not {LOG_FORMAT!r}")
JOBQUEUE_LOG_LEVEL = env("JOBQUEUE_LOG_LEVEL", default="INFO").upper()


def _at_least_warning(level):
    """``level`` (a logging level's name), or WARNING where that is lower."""
    return level if logging.getLevelNamesMapping().get(level, 0) >= logging.WARNING else "WARNING"


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"job": {"()": "queue_app.core.telemetry.JobFields"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s"
            " %(job_id)s %(kind)s %(queue)s %(attempt)s %(worker_id)s %(trace_id)s",
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["job"]}},
    "loggers": {
        "queue_app": {"handlers": ["console"], "level": JOBQUEUE_LOG_LEVEL},
        # Django's own receivers log each task's start and end at INFO to Django's
        # handlers, which print INFO only with DEBUG on (require_debug_true). Below that
        # level no record is made, as for ours: made and dropped, they were a third of what
        # a no-op @task job cost a worker beyond a native one (benchmarks/task_overhead.py).
        "django.tasks": {"level": JOBQUEUE_LOG_LEVEL if DEBUG else _at_least_warning(JOBQUEUE_LOG_LEVEL)},
        # With DEBUG off Django mails 500s to ADMINS (none here): log their tracebacks instead.
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}

# OTEL_SETUP=package.module.function: called once at start-up to set up an OpenTelemetry
# SDK and exporter (the tests' and benchmarks' hook, e.g. tests.otel_setup.configure; a
# site does this its own way). Without it spans go to OpenTelemetry's no-op default.
if OTEL_SETUP := env("OTEL_SETUP", default=""):
    from django.utils.module_loading import import_string

    import_string(OTEL_SETUP)()

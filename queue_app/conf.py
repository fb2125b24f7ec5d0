"""The queue's settings, with defaults.

A project overrides any of them in its settings module::

    JOBQUEUE = {
        "LEASE_SECONDS": 60,
        "AGING_INTERVAL": 0,     # disable priority aging
    }

This is the only module that reads ``django.conf.settings`` for the queue; everything
else asks ``queue_app.conf.settings``. Values reload when a test overrides settings.
"""

import logging
import time

from django.core.signals import setting_changed

log = logging.getLogger("queue_app")

DEFAULTS = {
    # Queue a job lands in when enqueue() is not told otherwise.
    "DEFAULT_QUEUE": "default",
    # Attempts a job gets unless enqueue() says otherwise.
    "DEFAULT_MAX_ATTEMPTS": 3,
    # Seconds a claim holds a job before another worker may recover it; also how long a
    # worker may go without a heartbeat before every surface shows it as lost.
    "LEASE_SECONDS": 30.0,
    # Seconds of waiting that earn a ready job one point of priority; 0 disables aging.
    "AGING_INTERVAL": 30.0,
    # Retry delay: BACKOFF_BASE ** attempt seconds, capped, optionally jittered.
    "BACKOFF_BASE": 2.0,
    "BACKOFF_MAX_SECONDS": 3600.0,
    "BACKOFF_JITTER": False,
    # Per-job execution limit when a job sets none; None means no limit.
    "DEFAULT_TIMEOUT": None,
    # Bounds that enqueue() enforces before anything is written.
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    "MAX_ATTEMPTS_LIMIT": 1000,
    "MAX_TIMEOUT_SECONDS": 7 * 24 * 3600,
    "MAX_BATCH": 1000,
    # Rows per INSERT in bulk_enqueue (stays below SQLite's variable limit).
    "BULK_BATCH_SIZE": 500,
    # kind -> "dotted.path.to.callable", merged into the handler registry at start-up.
    "HANDLERS": {},
    # True registers the sample workloads (ops/samples.py: email, report, webhook, flaky,
    # slow, crashy) for the demo, the tests and trying the queue by hand. Off in a
    # real deployment: crashy kills its worker's process and slow holds it for minutes,
    # so any API writer could take the workers down.
    "SAMPLE_HANDLERS": False,
    # Fault injection (faults.py): kind -> FaultPlan options, e.g. {"email": {"seed": 7,
    # "error": 0.1, "delay": [0.05, 0.2]}}; wraps that kind's handler wherever it is looked up.
    "FAULTS": {},
    # A kind nobody registered may name a django.tasks Task (``myapp.tasks.send``); only
    # modules inside these packages are imported to find one. None means the packages of
    # INSTALLED_APPS plus the project's (of the settings module and ROOT_URLCONF).
    "TASK_MODULES": None,
    # `manage.py enqueue --command "..."` and the sample "shell" kind run shell commands
    # on the workers: off unless a project turns it on.
    "SHELL_JOBS": False,
    # A string command is split with shlex and run without a shell; True runs it with
    # /bin/sh -c instead (pipes, redirections, $VARS: and whatever else a payload says).
    "SHELL_JOBS_USE_SHELL": False,
    # The worker's environment variables a shell job's command sees; every other one
    # (SECRET_KEY, DATABASE_URL, credentials) is left out, and the output is stored.
    "SHELL_JOBS_ENV": ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME"),
    # What a handler prints or logs while it runs (and a shell job's output) is kept
    # with the attempt's event: the last this-many bytes of each stream; 0 disables.
    "OUTPUT_MAX_BYTES": 64 * 1024,
    # `manage.py prune`: jobs deleted (with their events) per transaction.
    "PRUNE_BATCH_SIZE": 1000,
    # `manage.py doctor`: a completed job's events older than this many days mean nothing
    # prunes the event table.
    "DOCTOR_PRUNE_DAYS": 30,
    # doctor EXPLAINs the claim's and the dashboard's queries on tables this large: on a
    # smaller one reading it all is the planner's right choice, not a missing index.
    "DOCTOR_EXPLAIN_MIN_ROWS": 10_000,
    # runworker: processes, threads per process and jobs leased per claim.
    "WORKER_CONCURRENCY": 1,
    "WORKER_THREADS": 1,
    "WORKER_BATCH": 10,
    # Queues a worker serves when not told; "*" is all of them.
    "WORKER_QUEUES": ["*"],
    # Kinds a worker runs when not told (`runworker --kind`); empty is every kind.
    "WORKER_KINDS": [],
    # A worker exits (gracefully) after this many jobs / seconds; None means never.
    "WORKER_MAX_JOBS": None,
    "WORKER_MAX_RUNTIME": None,
    # True: a worker runs the ready jobs, then exits (`runworker --burst`).
    "WORKER_BURST": False,
    # Seconds an idle worker waits before looking again (PostgreSQL also wakes on NOTIFY).
    "POLL_INTERVAL": 1.0,
    # Seconds between lease renewals and registry heartbeats; None means LEASE_SECONDS / 3.
    "HEARTBEAT_INTERVAL": None,
    # Times a job may snooze (its handler raises Snooze) before a snooze fails its attempt.
    "MAX_SNOOZES": 100,
    # Attempts of one job that may end with its worker process dead (a crash, an OOM kill,
    # a timeout kill) before it is dead-lettered as "poison", whatever attempts it has left.
    "MAX_CRASHES": 3,
    # Encrypted payloads (core/encryption.py): Fernet keys, the first encrypts and every
    # one decrypts (rotation: put the new key first, run `manage.py reencrypt`, then drop
    # the old one), and kind -> True (its whole payload) or [field names] for kinds not
    # declared with encrypt= on their @handler or @task.
    "ENCRYPTION_KEYS": (),
    "ENCRYPTED_KINDS": {},
    # Seconds between sweeps for expired leases (one also runs at start-up).
    "RECOVERY_INTERVAL": 15.0,
    # Times recovery may give a job its attempt back because its row never showed the
    # attempt running (a whole worker died with it claimed, unstarted): the bound keeps a
    # job that kills its worker as soon as it starts from being given back for ever.
    "RECOVERY_RETURNS": 2,
    # Seconds a stopping worker lets claimed jobs finish before releasing them.
    "GRACE_SECONDS": 30.0,
    # Abort (aborting.py): seconds between a supervisor's looks for abort requests on the
    # jobs its children run, and seconds a handler has to stop on its own before its
    # process is killed (and replaced) and the job cancelled.
    "ABORT_CHECK_INTERVAL": 1.0,
    "ABORT_GRACE_SECONDS": 10.0,
    # Progress (running.py): a handler's progress/metadata is written at most once per
    # this many seconds; the latest value is always written when the handler ends.
    "PROGRESS_INTERVAL": 1.0,
    # PostgreSQL channel that enqueue NOTIFYs and each runworker's supervisor LISTENs on
    # (one wake-up per NOTIFY, to one idle child: worker/wakeup.py); None disables.
    "NOTIFY_CHANNEL": "jobqueue",
    # PostgreSQL: the worker's claim and acknowledgement statements are prepared once per
    # connection (server-side binding) instead of parsed on every call: about a third of
    # the server's work on a claim. False behind a pooler that cannot keep prepared
    # statements (PgBouncer in transaction mode before 1.21).
    "POSTGRES_PREPARE": True,
    # SQLite: seconds between the supervisor's looks at PRAGMA data_version (whether any
    # connection committed since) where inotify on the WAL file is not available; it
    # wakes one idle child when new work was committed; 0 disables (plain polling).
    "SQLITE_WAKE_INTERVAL": 0.005,
    # MariaDB: seconds between the supervisor's looks at the newest event id (one index
    # read); it wakes one idle child when new work arrived; 0 disables (plain polling).
    "MARIADB_WAKE_INTERVAL": 0.02,
    # /metrics: with a token set, a scrape must send "Authorization: Bearer <token>" (or
    # basic auth with the token as password). Without one only loopback clients are
    # served, unless METRICS_PUBLIC opens it to all.
    "METRICS_TOKEN": None,
    "METRICS_PUBLIC": False,
    # Label cardinality caps: kinds/queues past these are reported as "_other".
    "METRICS_MAX_KINDS": 50,
    "METRICS_MAX_QUEUES": 50,
    # Upper bounds (seconds) of jobqueue_job_duration_seconds; +Inf is added.
    "METRICS_DURATION_BUCKETS": (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0),
    # Upper bounds (seconds) of jobqueue_job_wait_seconds (ready to claimed); a queue that
    # keeps up answers in well under a second, a backlog in minutes.
    "METRICS_WAIT_BUCKETS": (0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0),
    # Events folded into the counters per step, and how long an id skipped by the fold
    # (its transaction had not committed) is watched for a late commit.
    "METRICS_FOLD_BATCH": 50_000,
    "METRICS_GAP_SECONDS": 600,
    # JSON API: reads without credentials when True; writes always need a permission.
    "API_READS_OPEN": False,
    "API_KEY_HEADER": "X-API-Key",
    # Request bodies over this many bytes get 413 before they are parsed.
    "API_MAX_BODY_BYTES": 4 * 1024 * 1024,
    # Characters of each payload, result and error message a list row carries (the API's
    # and the dashboard's lists); the whole of them only on the job's own page.
    "LIST_PREVIEW_CHARS": 200,
    # Redaction (ops/redaction.py), wherever a payload, result, error, traceback or output
    # is shown to a caller without queue_app.view_unredacted_payload: a JSON key holding
    # one of these words (any case, "-" as "_") has its value replaced, at any depth ...
    "REDACT_KEYS": (
        "password",
        "passwd",
        "token",
        "secret",
        "authorization",
        "api_key",
        "apikey",
        "cookie",
        "session",
        "credential",
        "private_key",
    ),
    # ... and every match of these regular expressions in a string is replaced: bearer
    # tokens, our own API keys, user:password@ in URLs, key=value pairs.
    "REDACT_PATTERNS": (
        r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}",
        r"\bjq_[A-Za-z0-9_-]{16,}",
        r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)",
        r"(?i)\b(?:password|passwd|pwd|secret|token|api[_-]?key)\s*[=:]\s*[^\s,;&\"']+",
    ),
    "API_PAGE_SIZE": 50,
    # GET /api/jobs/{id}?wait=: the longest a request may wait for the job to end (it
    # holds a web worker thread meanwhile).
    "API_MAX_WAIT_SECONDS": 30.0,
    "API_MAX_PAGE_SIZE": 500,
    # /health: fewer live workers than this is 503. Live means not stopped and not lost;
    # a worker is lost once its heartbeat is older than LEASE_SECONDS (models.lost_before),
    # the one rule every surface uses.
    "HEALTH_MIN_WORKERS": 1,
    # Operations UI. An action over every job matching a filter runs in transactions of
    # OPS_BATCH_SIZE jobs and stops after OPS_ACTION_SECONDS (the operator runs it again
    # for the rest), so a 100,000-job action neither times out nor holds long locks.
    "OPS_BATCH_SIZE": 200,
    "OPS_ACTION_SECONDS": 20.0,
    # Past this many rows the admin shows a capped count instead of counting the table.
    "OPS_COUNT_CAP": 10000,
    # A ready job that has waited longer than this is "late" (a paused one never is).
    "OPS_LATE_SECONDS": 300.0,
    # The overview counts completed and cancelled jobs (history that only grows) up to
    # this many, then shows "N+"; live states are always counted exactly.
    "DASHBOARD_COUNT_CAP": 100000,
    "DASHBOARD_PAGE_SIZE": 50,
    "DASHBOARD_REFRESH_SECONDS": 5,
    # Flow control (flow.py): kind -> {"concurrency": N, "per_key": N, "rate_limit": N,
    # "rate_period": s, "fair": bool, "fair_weights": {key: N}}; per_key caps leased
    # jobs per Job.concurrency_key; fair leases the concurrency keys (tenants)
    # round-robin, N jobs a round for a weighted key (flow.py, Fair share).
    # Copied into the KindLimit table when a worker starts or `manage.py limits --sync`
    # runs; edit them at runtime in the admin or with `manage.py limits`.
    "LIMITS": {},
    # Cron schedules (scheduling.py): name -> {"cron", "kind", "payload", "queue_name",
    # "priority", "timezone", "enabled", "missed_ticks"}; synced into the Schedule table.
    "SCHEDULES": {},
    # Seconds between a worker's schedule ticks; 0 disables ticking in that worker.
    "SCHEDULE_INTERVAL": 1.0,
    # A due tick older than this many seconds was missed (the scheduler was down).
    "SCHEDULE_GRACE_SECONDS": 60.0,
    # What happens to missed ticks: "run_once" (the latest of them runs) or "skip".
    "SCHEDULE_MISSED_TICKS": "run_once",
    # Webhooks (webhooks.py): only these hosts may be called (exact names or IPs; a
    # leading "." allows subdomains). Empty refuses every webhook.
    "WEBHOOK_ALLOWED_HOSTS": [],
    # A webhook host's resolved address must be public (not loopback, private, link-local,
    # multicast, reserved, unspecified) unless it lies in one of these networks, e.g.
    # ["10.1.2.0/24"] for an internal receiver.
    "WEBHOOK_ALLOWED_NETWORKS": [],
    # Schemes and ports an allowed host may be reached on: https on 443 unless listed
    # (None: any port). Plain http carries the signed body and its signature in the clear.
    "WEBHOOK_ALLOWED_SCHEMES": ["https"],
    "WEBHOOK_ALLOWED_PORTS": [443],
    # With a secret, each attempt carries "X-Jobqueue-Signature: t=<unix seconds>,v1=<hex>",
    # the HMAC-SHA256 of b"<t>." + body; receivers check it with webhooks.verify().
    "WEBHOOK_SECRET": None,
    "WEBHOOK_TIMEOUT": 10.0,
    "WEBHOOK_MAX_ATTEMPTS": 5,
    # Queue of delivery jobs; None delivers on the finished job's own queue.
    "WEBHOOK_QUEUE": None,
    # `manage.py web`: gunicorn's bind address, worker processes (None: one per CPU, at
    # least 2), threads per process and request timeout. Threaded workers (gthread): a slow
    # or unfinished request holds one thread, not a whole process.
    "WEB_ADDR": "127.0.0.1:8000",
    "WEB_WORKERS": None,
    "WEB_THREADS": 8,
    "WEB_TIMEOUT": 60,
    # Seconds a process keeps the runtime settings (below) it read from the database
    # before reading them again: how soon a `manage.py config set` reaches every worker,
    # for one query per process per interval, never one per job.
    "RUNTIME_SETTINGS_TTL": 2.0,
}

# What an operator may change while the queue runs (`manage.py config`, the admin, the
# API: core/runtime.py). A value stored in the RuntimeSetting table wins over JOBQUEUE's.
RUNTIME = (
    "DEFAULT_MAX_ATTEMPTS",
    "BACKOFF_BASE",
    "BACKOFF_MAX_SECONDS",
    "AGING_INTERVAL",
    "LEASE_SECONDS",
    "RECOVERY_INTERVAL",
)
_RUNTIME = frozenset(RUNTIME)


class QueueSettings:
    """Attribute access to JOBQUEUE settings that falls back to DEFAULTS."""

    def __init__(self, defaults):
        self._defaults = defaults
        self._cache = {}
        # The runtime settings' loader (set by the app: core/runtime.load), what it last
        # returned, and until when (time.monotonic()) that stands.
        self._store = None
        self._stored = {}
        self._stored_until = 0.0

    @property
    def _user(self):
        from django.conf import settings as django_settings

        return getattr(django_settings, "JOBQUEUE", {}) or {}

    def __getattr__(self, name):
        if name not in self._defaults:
            raise AttributeError(f"Invalid JOBQUEUE setting: {name!r}")
        if name in _RUNTIME:
            if self._store is not None:
                stored = self.stored()
                if name in stored:
                    return stored[name]
        elif name not in self._cache:
            # Kept as an attribute too: the next read finds it without this method, which
            # Python calls only after a failed lookup (an AttributeError made and caught,
            # most of a read's cost: an enqueue reads six). reload() takes them away.
            # Never a runtime setting's: the store may change it at any read.
            value = self._cache[name] = self._user.get(name, self._defaults[name])
            self.__dict__[name] = value
            return value
        if name not in self._cache:
            self._cache[name] = self._user.get(name, self._defaults[name])
        return self._cache[name]

    def configured(self, name):
        """``name``'s value from JOBQUEUE or the defaults, whatever the store says."""
        return self._user.get(name, self._defaults[name])

    def use_store(self, loader):
        """Read the runtime settings with ``loader()`` -> {name: value} (None: not at all)."""
        self._store = loader
        self._stored, self._stored_until = {}, 0.0

    def stored(self):
        """The runtime settings in the store, read again once RUNTIME_SETTINGS_TTL has
        passed. When the read fails (no table yet, the database away) the last values
        stand and the next read waits a TTL too: a setting must not fail its caller."""
        now = time.monotonic()
        if now >= self._stored_until:
            self._stored_until = now + float(self.RUNTIME_SETTINGS_TTL)
            try:
                self._stored = self._store()
            except Exception as exc:
                log.debug("runtime settings not read: %r", exc)
        return self._stored

    def reload(self):
        for name in self._cache:
            self.__dict__.pop(name, None)
        self._cache.clear()
        self._stored_until = 0.0


def _runtime(name):
    # A runtime setting is a property, found by the ordinary lookup: through
    # __getattr__ each read would first fail one (an AttributeError made and caught).
    return property(lambda self: self.__getattr__(name), doc=f"{name} (a runtime setting)")


for _name in RUNTIME:
    setattr(QueueSettings, _name, _runtime(_name))

settings = QueueSettings(DEFAULTS)


def missing_secret_key():
    """Return a one-line message when the site has no SECRET_KEY (None when it has one),
    for entry points that serve or sign to refuse to start with."""
    from django.conf import settings as django_settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        if django_settings.SECRET_KEY:
            return None
    except ImproperlyConfigured:
        pass
    return (
        'SECRET_KEY is not set: set it in the environment (e.g. export SECRET_KEY="$(python3 -c '
        "'import secrets; print(secrets.token_urlsafe(50))')\"), or run with DEBUG=1 for a throwaway one"
    )


def project_packages():
    """The top-level packages of the settings module and ROOT_URLCONF."""
    from django.conf import settings as django_settings

    paths = (
        getattr(django_settings, "SETTINGS_MODULE", None),
        getattr(django_settings, "ROOT_URLCONF", None),
    )
    return [path.partition(".")[0] for path in paths if isinstance(path, str) and path]


def _reload(*, setting, **kwargs):
    if setting == "JOBQUEUE":
        settings.reload()


setting_changed.connect(_reload)

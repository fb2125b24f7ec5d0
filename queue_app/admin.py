"""The Django admin for operators: jobs with their timeline, dead letters, events, workers.

Jobs are never saved from a form: every change is an action that goes through
``queue_app.ops.actions`` (and so ``transitions``), which writes the job's event. Each
action comes twice: for the selected jobs, and for every job matching the current
filter and search, which runs in batches (see ``actions.apply_many``). Statuses and the
lost-worker rule come from ``queue_app.models``, the counts and lists from ``ops.reads``.
"""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Q, TextField
from django.db.models.functions import Cast
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from queue_app.conf import RUNTIME, settings
from queue_app.core import flow, runtime, validation
from queue_app.exceptions import InvalidJob
from queue_app.models import (
    STATUSES,
    WORKER_STATUSES,
    ApiKey,
    DeadLetter,
    Event,
    Job,
    JobGroup,
    KindLimit,
    Pause,
    RuntimeSetting,
    Schedule,
    SettingChange,
    State,
    Worker,
)
from queue_app.ops import actions as operations
from queue_app.ops import dashboard, reads, redaction
from queue_app.worker import capture
from queue_app.worker import schedules as scheduling

MATCHING = "_matching"
# Query parameters of the change list that order or page it without narrowing it.
UNFILTERING = {"o", "p", "_changelist_filters"}

try:
    from django.contrib.admin.options import ActionLocation

    ACTION_LIST = ActionLocation.CHANGE_LIST
except ImportError:  # Django 6.0: actions have no location yet
    ACTION_LIST = None


def _location(action_location):
    """The arguments for ModelAdmin.get_actions(): Django 6.1 takes where the actions
    show (and warns about overrides without it); 6.0 takes nothing."""
    return () if action_location is None else (action_location,)


class StatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [(name, label) for name, label, _ in dashboard.status_choices()]

    def queryset(self, request, queryset):
        if self.value() not in STATUSES:
            return queryset
        return reads.Filters(state=self.value()).apply(queryset)


class WorkerStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [(name, name) for name, _ in dashboard.worker_status_choices()]

    def queryset(self, request, queryset):
        return queryset.status(self.value()) if self.value() in WORKER_STATUSES else queryset


class QueueModelAdmin(admin.ModelAdmin):
    """The admins here: lists filter through their own filters only."""

    def lookup_allowed(self, lookup, value, request=None):
        # Only what the list's own filters send: any other lookup from the query string
        # (?payload__contains=, ?kind__regex=(, an id past 64 bits) could 500, and so could
        # a NUL on PostgreSQL. Django answers a refusal with 400.
        if "\x00" in str(value):
            return False
        allowed = set()
        for entry in self.get_list_filter(request) if request is not None else self.list_filter:
            if isinstance(entry, type) and issubclass(entry, admin.SimpleListFilter):
                allowed.add(entry.parameter_name)
            else:
                field = entry[0] if isinstance(entry, (list, tuple)) else entry
                allowed.update({field, f"{field}__exact", f"{field}__isnull"})
        return lookup in allowed


class _Redacted:
    """Rows shown redacted (ops/redaction.py) to a user without redaction.PERMISSION,
    in the list and on the object's page; the stored rows are not touched."""

    def get_object(self, request, object_id, from_field=None):
        found = super().get_object(request, object_id, from_field)
        if found is None:
            return found
        if request.user.has_perm(redaction.PERMISSION):
            return redaction.revealed(found)  # its encrypted values decrypted
        return redaction.row(found)

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        unredacted = request.user.has_perm(redaction.PERMISSION)
        changelist.result_list = redaction.rows(changelist.result_list, unredacted)
        return changelist


class _ChoiceFilter(admin.SimpleListFilter):
    """A column filter whose choices come from live jobs only (a capped DISTINCT),
    so opening the list does not scan a million finished rows for them."""

    field = ""
    key = ""

    def lookups(self, request, model_admin):
        return [(v, v) for v in reads.filter_choices()[self.key]]

    def queryset(self, request, queryset):
        # PostgreSQL cannot compare text holding a NUL; no kind or queue name has one.
        value = (self.value() or "").replace("\x00", "")
        return queryset.filter(**{self.field: value}) if value else queryset


class KindFilter(_ChoiceFilter):
    title = parameter_name = field = "kind"
    key = "kinds"


class QueueFilter(_ChoiceFilter):
    title = "queue"
    parameter_name = field = "queue_name"
    key = "queues"


class _ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_formset(self, request, obj=None, **kwargs):
        formset = super().get_formset(request, obj, **kwargs)
        unredacted = request.user.has_perm(redaction.PERMISSION)

        class Redacted(formset):
            def get_queryset(self):
                if not hasattr(self, "_redacted"):
                    self._redacted = redaction.rows(super().get_queryset(), unredacted)
                return self._redacted

        return Redacted


class EventInline(_ReadOnlyInline):
    model = Event
    fields = [
        "at",
        "type",
        "from_state",
        "to_state",
        "attempt",
        "worker",
        "message",
        "captured_output",
        "metadata",
    ]
    readonly_fields = fields
    ordering = ["id"]

    @admin.display(description="output")
    def captured_output(self, event):
        """What the attempt's handler printed and logged (capture.py), one block per stream."""
        return format_html_join(
            "",
            "<div><strong>{}</strong>{}"
            '<pre style="white-space: pre-wrap; max-height: 16em; overflow: auto">{}</pre></div>',
            (
                (name, f" (last part; {dropped} bytes dropped)" if dropped else "", text)
                for name, text, dropped in capture.streams((event.metadata or {}).get("output"))
            ),
        )


class DeadLetterInline(_ReadOnlyInline):
    model = DeadLetter
    fields = ["created_at", "reason", "attempts", "error", "resolved_at", "resolution"]
    readonly_fields = fields


def _unfiltered(request):
    return not any(k not in UNFILTERING for k in request.GET)


def report(request, action, outcome):
    """Tell the operator what a batched action did, and whether to run it again."""
    text, clean = operations.summary(action, outcome)
    messages.add_message(request, messages.SUCCESS if clean else messages.WARNING, text)


def _make_action(action, matching):
    def run(modeladmin, request, queryset):
        return modeladmin.run_action(request, queryset, action, matching)

    run.__name__ = action.name + (MATCHING if matching else "")
    what = f"{action.label}: every job matching the filter" if matching else f"{action.label} selected jobs"
    return admin.action(run, description=what, permissions=[action.permission])


@admin.register(Job)
class JobAdmin(_Redacted, QueueModelAdmin):
    list_display = [
        "id",
        "kind",
        "queue_name",
        "status_badge",
        "priority",
        "effective",
        "attempts_column",
        "run_at",
        "age",
    ]
    list_display_links = ["id"]
    list_filter = [StatusFilter, KindFilter, QueueFilter]
    # The search itself is get_search_results(); this only turns the box on.
    search_fields = ["kind"]
    search_help_text = "A job id, or text in the kind, idempotency key or payload."
    readonly_fields = [f.name for f in Job._meta.fields] + ["dashboard_link"]
    inlines = [EventInline, DeadLetterInline]
    show_full_result_count = False
    paginator = reads.CappedPaginator
    list_per_page = 50
    actions = [_make_action(a, m) for m in (False, True) for a in operations.ACTIONS.values()]

    def get_queryset(self, request):
        # Each row's status is read in the list's own query, not one query per row.
        return super().get_queryset(request).with_status()

    def has_add_permission(self, request):
        # Jobs come in through enqueue() (code, API, CLI), which validates them.
        return False

    def has_change_permission(self, request, obj=None):
        # No form ever saves a job: a saved form would write back a state a worker
        # may have changed meanwhile. Actions (checked with obj=None) still need it.
        if obj is not None:
            return False
        return super().has_change_permission(request)

    def get_actions(self, request, action_location=ACTION_LIST):
        actions = super().get_actions(request, *_location(action_location))
        # Django's own delete collects every related row for its confirmation page:
        # hopeless over a filter of 100,000 jobs. Ours deletes in batches.
        actions.pop("delete_selected", None)
        return actions

    def delete_model(self, request, obj):
        # A job's own delete page goes through the one delete, which takes the job out
        # of the metrics' kept counts in the same transaction.
        operations.apply("delete", obj.id, actor=f"admin:{request.user.get_username()}")

    def delete_queryset(self, request, queryset):
        operations.apply_many(
            "delete", queryset, actor=f"admin:{request.user.get_username()}", seconds=float("inf")
        )

    def changelist_view(self, request, extra_context=None):
        if request.method == "POST":
            chosen = request.POST.getlist("action")
            index = request.POST.get("index", "0")
            name = chosen[int(index)] if index.isdigit() and int(index) < len(chosen) else ""
            if name.endswith(MATCHING):
                # "Every job matching the filter" is Django's select-across, asked for
                # by the action itself so it works without the page's script.
                post = request.POST.copy()
                post["select_across"] = "1"
                if not post.getlist(helpers.ACTION_CHECKBOX_NAME):
                    post.setlist(helpers.ACTION_CHECKBOX_NAME, ["0"])
                request.POST = post
        return super().changelist_view(request, extra_context)

    def get_search_results(self, request, queryset, search_term):
        # PostgreSQL cannot compare text holding a NUL; no kind, key or payload text has one.
        term = search_term.replace("\x00", "").strip()
        if not term:
            return queryset, False
        if (job_id := reads.as_id(term.lstrip("#"))) is not None:
            return queryset.filter(id=job_id), False
        matches = Q(kind__icontains=term) | Q(idempotency_key__icontains=term)
        if not request.user.has_perm(redaction.PERMISSION):
            # Searching the payload would tell whether a redacted secret holds the term.
            return queryset.filter(matches), False
        matches |= Q(payload_text__icontains=term)
        return queryset.annotate(payload_text=Cast("payload", TextField())).filter(matches), False

    def run_action(self, request, queryset, action, matching):
        actor = f"admin:{request.user.get_username()}"
        # Every action over a whole filter stops at a page with its count first: one
        # click with no filter set used to cancel every live job.
        needs_form = action.param is not None or action.name == "delete" or matching
        value = request.POST.get(action.param) if action.param else None
        error = None
        if action.name == "edit_payload" and not request.user.has_perm(redaction.PERMISSION):
            messages.error(
                request, f"{action.label} refused: {operations.PAYLOAD_REFUSAL}. Nothing was changed."
            )
            return None
        if matching and _unfiltered(request):
            # "Every job matching the filter" with no filter is every job in the table.
            messages.error(
                request,
                f"{action.label} refused: no filter or search is set, so it would touch every job. "
                "Narrow the list first, or select the jobs. Nothing was changed.",
            )
            return None
        if needs_form and request.POST.get("confirm") == "yes":
            try:
                operations.clean(action, value)
            except InvalidJob as exc:
                error = str(exc)
        if needs_form and (request.POST.get("confirm") != "yes" or error):
            if error:
                messages.error(request, f"{action.label} refused: {error}. Nothing was changed.")
            return self._action_form(request, queryset, action, matching, value, error)
        outcome = operations.apply_many(
            action.name,
            queryset,
            value,
            actor=actor,
            may_run_shell=request.user.has_perm(validation.SHELL_PERMISSION),
            may_edit_payload=request.user.has_perm(redaction.PERMISSION),
        )
        report(request, action, outcome)
        return None

    def _action_form(self, request, queryset, action, matching, value, error):
        cap = settings.OPS_COUNT_CAP
        count = queryset.filter(state__in=action.states).order_by()[: cap + 1].count()
        if value is None and action.param == "payload" and not matching:
            first = queryset.order_by("id").first()
            value = dashboard.json_text(first.payload) if first else "{}"
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"{action.label}: {'every job matching the filter' if matching else 'selected jobs'}",
            "action": action,
            "action_name": action.name + (MATCHING if matching else ""),
            "matching": matching,
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "count": count,
            "capped": count > cap,
            "value": "" if value is None else value,
            "error": error,
        }
        return TemplateResponse(request, "admin/queue_app/job/action_form.html", context)

    @admin.display(description="status", ordering="state")
    def status_badge(self, job):
        return f"{job.status} (late)" if job.is_late else job.status

    @admin.display(description="effective priority")
    def effective(self, job):
        value = dashboard.effective_priority(job)
        return "—" if value is None else value

    @admin.display(description="attempts", ordering="attempts")
    def attempts_column(self, job):
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="age", ordering="created_at")
    def age(self, job):
        return dashboard.age(job.created_at)

    @admin.display(description="dashboard")
    def dashboard_link(self, job):
        url = reverse("queue_app_dashboard:job", args=[job.id])
        return format_html('<a href="{}">Timeline and actions on the dashboard</a>', url)


class _AppendOnly(QueueModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(JobGroup)
class JobGroupAdmin(_AppendOnly):
    """Groups are made by canvas.group and counted by their members' transitions: read only."""

    list_display = ["id", "name", "policy", "group_status", "progress", "callback_job_id", "created_at"]
    list_filter = ["policy"]
    readonly_fields = [f.name for f in JobGroup._meta.fields]
    show_full_result_count = False

    @admin.display(description="status")
    def group_status(self, group):
        return group.status

    @admin.display(description="ended")
    def progress(self, group):
        return f"{group.ended} of {group.total} ({group.completed} completed, {group.dead} dead, {group.cancelled} cancelled)"


@admin.register(Event)
class EventAdmin(_Redacted, _AppendOnly):
    list_display = ["id", "at", "job_link", "type", "from_state", "to_state", "attempt", "worker", "message"]
    list_filter = ["type"]
    search_fields = ["=job__id"]
    search_help_text = "A job id."
    show_full_result_count = False
    paginator = reads.CappedPaginator
    ordering = ["-id"]

    @admin.display(description="job", ordering="job_id")
    def job_link(self, event):
        return format_html(
            '<a href="{}">#{}</a>', reverse("admin:queue_app_job_change", args=[event.job_id]), event.job_id
        )


class ResolvedFilter(admin.SimpleListFilter):
    title = "resolved"
    parameter_name = "resolved"

    def lookups(self, request, model_admin):
        return [("no", "unresolved"), ("yes", "resolved")]

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(resolved_at__isnull=self.value() == "no")
        return queryset


@admin.register(DeadLetter)
class DeadLetterAdmin(_Redacted, _AppendOnly):
    list_display = [
        "id",
        "job_link",
        "kind",
        "attempts",
        "reason",
        "error_message",
        "created_at",
        "resolved_at",
    ]
    list_filter = [ResolvedFilter, "reason"]
    search_fields = ["=job__id", "kind"]
    show_full_result_count = False
    paginator = reads.CappedPaginator
    actions = ["requeue_jobs"]

    @admin.action(description="Requeue these dead letters' jobs", permissions=["requeue"])
    def requeue_jobs(self, request, queryset):
        jobs = Job.objects.filter(id__in=queryset.values("job_id"))
        outcome = operations.apply_many(
            "requeue",
            jobs,
            actor=f"admin:{request.user.get_username()}",
            may_run_shell=request.user.has_perm(validation.SHELL_PERMISSION),
        )
        report(request, operations.ACTIONS["requeue"], outcome)

    def has_requeue_permission(self, request):
        # Requeueing changes jobs, so it takes the permission to change jobs.
        return request.user.has_perm("queue_app.change_job")

    @admin.display(description="job", ordering="job_id")
    def job_link(self, letter):
        return format_html(
            '<a href="{}">#{}</a>', reverse("admin:queue_app_job_change", args=[letter.job_id]), letter.job_id
        )

    @admin.display(description="error")
    def error_message(self, letter):
        error = letter.error or {}
        return (
            f"{error.get('type', '')}: {error.get('message', '')}"[:160]
            if isinstance(error, dict)
            else str(error)[:160]
        )


@admin.register(Worker)
class WorkerAdmin(QueueModelAdmin):
    list_display = [
        "name",
        "host",
        "pid",
        "status",
        "heartbeat_age",
        "jobs_in_hand",
        "jobs_done",
        "concurrency",
        "threads",
        "queues",
        "started_at",
        "stop_requested_at",
        "quiet_requested_at",
    ]
    list_filter = [WorkerStatusFilter, "host"]
    search_fields = ["name", "host"]
    readonly_fields = [f.name for f in Worker._meta.fields]
    actions = ["quiet", "stop"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        # The row is the worker's own report; the only things an operator changes are
        # the quiet and stop requests, through the actions.
        return obj is None and super().has_change_permission(request)

    def get_actions(self, request, action_location=ACTION_LIST):
        actions = super().get_actions(request, *_location(action_location))
        actions.pop("delete_selected", None)
        return actions

    @admin.action(description="Stop selected workers (after their current jobs)", permissions=["change"])
    def stop(self, request, queryset):
        n = operations.request_stop(queryset.values_list("id", flat=True))
        self.message_user(request, f"Stop requested for {n} worker{'s' if n != 1 else ''}.", messages.SUCCESS)

    @admin.action(
        description="Quiet selected workers (lease no more, finish what they hold, stay up)",
        permissions=["change"],
    )
    def quiet(self, request, queryset):
        n = operations.request_quiet(queryset.values_list("id", flat=True))
        self.message_user(
            request, f"Quiet requested for {n} worker{'s' if n != 1 else ''}.", messages.SUCCESS
        )

    @admin.display(description="status")
    def status(self, worker):
        return worker.status

    @admin.display(description="heartbeat", ordering="last_heartbeat")
    def heartbeat_age(self, worker):
        return f"{dashboard.age(worker.last_heartbeat, timezone.now())} ago"


# --- flow control (flow.py, scheduling.py) ---------------------------------------------------


class _ValidatedForm(forms.ModelForm):
    """Runs the same checks as the Python API, so the admin cannot store what a claim or
    a tick would refuse."""

    def _check(self, func, *args, **kwargs):
        try:
            return func(*args, **kwargs)
        except InvalidJob as exc:
            raise forms.ValidationError({exc.field if exc.field in self.fields else None: str(exc)}) from None


class PauseForm(_ValidatedForm):
    class Meta:
        model = Pause
        fields = ["scope", "name", "reason"]

    def clean(self):
        data = super().clean()
        if data.get("name"):
            self._check(validation.name, data["name"], "name", 200)
        return data


@admin.register(Pause)
class PauseAdmin(QueueModelAdmin):
    form = PauseForm
    list_display = ["scope", "name", "created_at", "actor", "reason"]

    def save_model(self, request, obj, form, change):
        obj.actor = obj.actor or request.user.get_username()
        super().save_model(request, obj, form, change)


class KindLimitForm(_ValidatedForm):
    class Meta:
        model = KindLimit
        fields = ["kind", "concurrency", "per_key", "rate_limit", "rate_period", "fair", "fair_weights"]

    def clean(self):
        data = super().clean()
        if data.get("kind"):
            self._check(validation.name, data["kind"], "kind", 200)
        if 0 in (data.get("concurrency"), data.get("per_key"), data.get("rate_limit")):
            raise forms.ValidationError("a limit of 0 would stop the kind for good: pause it instead")
        if data.get("rate_period") is not None:
            self._check(validation.seconds, data["rate_period"], "rate_period", maximum=366 * 86400)
        if "fair_weights" in data:
            data["fair_weights"] = self._check(flow.weights, data["fair_weights"])
        if data.get("fair") and data.get("per_key") is not None:
            raise forms.ValidationError(
                "fair and per_key do not combine: per_key already leases keys in rounds; clear one of them"
            )
        return data


@admin.register(KindLimit)
class KindLimitAdmin(QueueModelAdmin):
    form = KindLimitForm
    list_display = [
        "kind",
        "concurrency",
        "leased_now",
        "per_key",
        "rate_limit",
        "rate_period",
        "fair",
        "from_settings",
        "updated_at",
    ]

    @admin.display(description="leased now")
    def leased_now(self, obj):
        return Job.objects.filter(state=State.LEASED, kind=obj.kind).count()

    def save_model(self, request, obj, form, change):
        obj.updated_at = timezone.now()
        obj.from_settings = False
        super().save_model(request, obj, form, change)


class ScheduleForm(_ValidatedForm):
    class Meta:
        model = Schedule
        fields = [
            "name",
            "cron",
            "kind",
            "payload",
            "queue_name",
            "priority",
            "timezone",
            "enabled",
            "missed_ticks",
        ]

    def clean(self):
        data = super().clean()
        if not self.errors:
            checked = ("name",) + scheduling.SCHEDULE_FIELDS
            cleaned = self._check(scheduling.validate, **{f: data.get(f) for f in checked})
            data.update(cleaned)
        return data


@admin.register(Schedule)
class ScheduleAdmin(QueueModelAdmin):
    form = ScheduleForm
    list_display = ["name", "cron", "kind", "queue_name", "timezone", "enabled", "last_tick", "next_run"]
    list_filter = ["enabled"]
    search_fields = ["name", "kind"]
    readonly_fields = ["last_tick", "from_settings", "created_at"]

    @admin.display(description="next run")
    def next_run(self, obj):
        if not obj.enabled:
            return "disabled"
        try:
            return scheduling.next_run(obj)
        except (InvalidJob, ValueError, KeyError):
            return "invalid"


@admin.register(ApiKey)
class ApiKeyAdmin(QueueModelAdmin):
    """Keys for the JSON API: seen and revoked here, created with ``manage.py apikey
    create`` (which shows the raw key once; only its hash is stored, so the admin cannot)."""

    list_display = [
        "name",
        "prefix",
        "scopes_shown",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    ]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix"]
    readonly_fields = ["name", "prefix", "created_at", "last_used_at", "revoked_at"]
    fields = [
        "name",
        "prefix",
        "can_write",
        "can_operate",
        "can_run_shell",
        "can_see_unredacted",
        "expires_at",
        *readonly_fields[2:],
    ]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.display(description="scopes")
    def scopes_shown(self, obj):
        return ", ".join(obj.scopes)

    @admin.action(description="Revoke the selected keys", permissions=["change"])
    def revoke(self, request, queryset):
        n = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        messages.info(request, f"revoked {n} key(s); they are refused from now on")


class RuntimeSettingForm(_ValidatedForm):
    name = forms.ChoiceField(choices=[(s, f"{runtime.KEYS[s]} ({s})") for s in RUNTIME])
    value = forms.CharField(help_text="A number; seconds settings also take 500ms, 30s, 5m, 1h.")

    class Meta:
        model = RuntimeSetting
        fields = ["name", "value"]

    def clean(self):
        data = super().clean()
        if data.get("name") and data.get("value") is not None:
            setting = data["name"]
            data["value"] = self._check(
                runtime.check, setting, self._check(runtime.parse, setting, data["value"])
            )
        return data


@admin.register(RuntimeSetting)
class RuntimeSettingAdmin(QueueModelAdmin):
    """Runtime settings (core/runtime.py): every save and delete goes through set_value()
    and unset(), so each one is checked and leaves its SettingChange row."""

    form = RuntimeSettingForm
    list_display = ["name", "value", "configured", "updated_at", "updated_by"]
    readonly_fields = ["updated_at", "updated_by"]

    @admin.display(description="JOBQUEUE's value")
    def configured(self, obj):
        return settings.configured(obj.name)

    def get_readonly_fields(self, request, obj=None):
        return [*self.readonly_fields, "name"] if obj is not None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        runtime.set_value(obj.name, form.cleaned_data["value"], actor=request.user.get_username())

    def delete_model(self, request, obj):
        runtime.unset(obj.name, actor=request.user.get_username())

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


@admin.register(SettingChange)
class SettingChangeAdmin(_AppendOnly):
    list_display = ["at", "name", "old", "new", "actor"]
    list_filter = ["name"]

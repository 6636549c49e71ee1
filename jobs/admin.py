"""Django admin: clusters, teams and quotas (money budgets too), GPU prices (added, never
edited), windows, tokens, webhooks; jobs are read-only here.

The clusters a team may use are rows on both the team's and the cluster's page; adding or
deleting one is a grant or a revoke through `jobs.grants` (a revoke clears the team's default
when it was that cluster). Saving a team with a default cluster grants it (`Team.save`).

Deleting a job here goes through `jobs.actions.control.delete_job`, like the API: an active or
queued job is refused (stop it first), and its logs and last-referenced snapshot go with it.
"""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected
from django.contrib.admin.utils import unquote
from django.db.models import Prefetch
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone

from jobs import grants
from jobs.actions import control
from jobs.actions.tokens import revoke_token
from jobs.actions.webhooks import new_secret
from jobs.errors import BadRequest
from jobs.models import (
    ActivityPolicy,
    ApiToken,
    Attempt,
    BudgetAlert,
    Cluster,
    ClusterGrant,
    ClusterShare,
    GpuPrice,
    IdleExemption,
    Job,
    JobEvent,
    Membership,
    ScheduleWindow,
    Team,
    TeamGpuTypeQuota,
    Webhook,
)
from jobs.states import JobStatus
from jobs.webhooks.targets import check_target

UNDELETABLE = JobStatus.active() | {JobStatus.QUEUED}


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1


class ClusterShareInline(admin.TabularInline):
    model = ClusterShare
    extra = 1


class ActivityPolicyInline(admin.StackedInline):
    """The team's idle and hang policy (jobs.watched): staff set it here, team admins through
    the API and `sf team set`."""

    model = ActivityPolicy
    extra = 0
    max_num = 1


class IdleExemptionInline(admin.TabularInline):
    """A job exempted from its team's idle policy, and by whom."""

    model = IdleExemption
    extra = 0
    max_num = 1
    autocomplete_fields = ()
    raw_id_fields = ("by",)


class GpuTypeQuotaInline(admin.TabularInline):
    model = TeamGpuTypeQuota
    extra = 0


class ClusterGrantInline(admin.TabularInline):
    """A row is a grant: add one to let the team use the cluster, delete it to revoke."""

    model = ClusterGrant
    extra = 0
    readonly_fields = ("granted_by", "granted_at")
    verbose_name = "cluster grant (the team may use the cluster)"

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # a grant is added or deleted, never pointed elsewhere


class GrantsThroughTheRule(admin.ModelAdmin):
    """Saves the grant rows of a team's or a cluster's page through `jobs.grants`."""

    def save_formset(self, request, form, formset, change) -> None:
        if formset.model is not ClusterGrant:
            return super().save_formset(request, form, formset, change)
        added = formset.save(commit=False)  # deletions are left to us too
        for grant in formset.deleted_objects:
            grants.revoke(grant.team, grant.cluster, request.user.username)
        for grant in added:
            grants.grant(grant.team, grant.cluster, request.user.username)
        return None


@admin.register(Team)
class TeamAdmin(GrantsThroughTheRule):
    """Quotas count from the scheduler's next tick; waiting jobs then say the new numbers."""

    list_display = (
        "name",
        "gpu_quota",
        "max_jobs",
        "gpu_hours_per_month",
        "money_budget_per_month",
        "budget_hard_stop",
        "user_gpu_cap",
        "max_gpus_per_job",
        "default_cluster",
        "window",
    )
    list_editable = ("gpu_quota", "max_jobs", "gpu_hours_per_month")
    fieldsets = (
        (None, {"fields": ("name",)}),
        (
            "Quotas (take effect at the scheduler's next tick)",
            {
                "fields": (
                    "gpu_quota",
                    "max_jobs",
                    "user_gpu_cap",
                    "max_gpus_per_job",
                    ("gpu_hours_per_month", "budget_hard_stop"),
                    ("money_budget_per_month", "budget_alert_percents"),
                    "max_member_priority",
                    "snapshot_quota_mb",
                    ("lendable", "borrow_cap"),
                )
            },
        ),
        (
            "Defaults (team admins can change these on the team page)",
            {
                "fields": (
                    "default_cluster",
                    "window",
                    "default_max_retries",
                    "default_retry_cooldown_s",
                    "default_time_limit_s",
                )
            },
        ),
    )
    inlines = [
        MembershipInline,
        ClusterGrantInline,
        ClusterShareInline,
        GpuTypeQuotaInline,
        ActivityPolicyInline,
    ]


@admin.register(Cluster)
class ClusterAdmin(GrantsThroughTheRule):
    list_display = ("name", "kind", "enabled", "window", "health", "teams")
    inlines = [ClusterGrantInline, ClusterShareInline]
    readonly_fields = (
        "unreachable_since",
        "unreachable_reason",
        "poll_failing_since",
        "poll_error",
    )

    def get_queryset(self, request):
        granted = ClusterGrant.objects.select_related("team").order_by("team__name")
        return super().get_queryset(request).prefetch_related(Prefetch("grants", granted))

    @admin.display(description="teams that may use it")
    def teams(self, cluster: Cluster) -> str:
        return ", ".join(grant.team.name for grant in cluster.grants.all()) or "none"

    @admin.display(description="health")
    def health(self, cluster: Cluster) -> str:
        if cluster.unreachable_since:
            return f"unreachable: {cluster.unreachable_reason}"
        if cluster.poll_failing_since:
            return f"poll failing: {cluster.poll_error}"
        return "ok"


@admin.register(ScheduleWindow)
class ScheduleWindowAdmin(admin.ModelAdmin):
    list_display = ("name", "timezone", "spec")


class WebhookForm(forms.ModelForm):
    def clean(self) -> dict:
        """The target rule (`jobs.webhooks.targets.check_target`), `allow_private` as ticked
        here: a malformed URL or a refused address is a sentence on the form, not a row."""
        cleaned = super().clean() or {}
        try:
            check_target(cleaned.get("url") or "", bool(cleaned.get("allow_private")))
        except BadRequest as exc:
            self.add_error("url", exc.detail)
        return cleaned


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    """Where staff let a webhook reach private addresses (`allow_private`); users add theirs
    through the API, the CLI and the console, which check the target."""

    form = WebhookForm
    list_display = ("pk", "owner", "team", "url", "allow_private", "created_at")
    list_filter = ("allow_private",)
    fields = ("owner", "team", "url", "events", "wait_after_s", "allow_private", "created_at")
    readonly_fields = ("created_at",)

    def save_model(self, request, obj, form, change) -> None:
        if not obj.secret:
            obj.secret = new_secret()
        super().save_model(request, obj, form, change)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = (
        "user",
        "name",
        "prefix",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
        "created_by",
    )
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at", "created_by")

    def save_model(self, request, obj, form, change) -> None:
        super().save_model(request, obj, form, change)
        if "revoked_at" in form.changed_data and obj.revoked_at is not None:
            revoke_token(obj.user, obj.pk)  # what the token created goes with it


class AttemptInline(admin.TabularInline):
    model = Attempt
    fk_name = "job"
    extra = 0
    can_delete = False
    readonly_fields = [f.name for f in Attempt._meta.fields]


class EventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = [f.name for f in JobEvent._meta.fields]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "team", "user", "status", "total_gpus", "submitted_at")
    list_filter = ("status", "team", "cluster")
    search_fields = ("name", "run_id")
    readonly_fields = [f.name for f in Job._meta.fields]
    inlines = [AttemptInline, EventInline, IdleExemptionInline]

    def has_add_permission(self, request) -> bool:
        return False  # jobs are submitted through the API, which runs the checks

    def delete_view(self, request, object_id, extra_context=None):
        job = self.get_object(request, unquote(object_id))
        if job is not None and job.status in UNDELETABLE:
            self.message_user(request, _refusal(job.pk, job.status), messages.ERROR)
            return HttpResponseRedirect(reverse("admin:jobs_job_change", args=[job.pk]))
        return super().delete_view(request, object_id, extra_context)

    def delete_model(self, request, obj: Job) -> None:
        control.delete_job(request.user, obj.pk)

    def delete_queryset(self, request, queryset) -> None:
        for pk in queryset.order_by("pk").values_list("pk", flat=True):
            control.delete_job(request.user, pk)

    def get_actions(self, request):
        actions = super().get_actions(request)
        default = actions.get("delete_selected")
        if default is not None:
            # Same name: the confirmation page posts back action=delete_selected.
            actions["delete_selected"] = (delete_finished_jobs, "delete_selected", default[2])
        return actions


def _refusal(job_id: int, status: str) -> str:
    return f"job {job_id} is {status}: stop it before deleting it"


def delete_finished_jobs(modeladmin: JobAdmin, request, queryset):
    """Django's delete action (with its confirmation page), refused while any job is active."""
    busy = list(queryset.filter(status__in=UNDELETABLE).order_by("pk").values_list("pk", "status"))
    if busy:
        refusals = "; ".join(_refusal(pk, status) for pk, status in busy)
        modeladmin.message_user(request, f"nothing was deleted: {refusals}", messages.ERROR)
        return None
    return delete_selected(modeladmin, request, queryset)


@admin.register(GpuPrice)
class GpuPriceAdmin(admin.ModelAdmin):
    """Prices are added, never edited: a change is a new price from a moment on, so what ran
    keeps the price it was billed at (`metering.cost`). A price may be deleted only while it
    has not started."""

    list_display = ("cluster", "gpu_type", "per_gpu_hour", "valid_from", "created_at")
    list_filter = ("cluster", "gpu_type")
    ordering = ("cluster", "gpu_type", "-valid_from")

    def has_change_permission(self, request, obj=None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and obj.valid_from <= timezone.now():
            return False
        return super().has_delete_permission(request, obj)


@admin.register(BudgetAlert)
class BudgetAlertAdmin(admin.ModelAdmin):
    """The money-budget alerts teams were sent: written by the scheduler, read here."""

    list_display = ("team", "month", "percent", "used_micros", "budget_micros", "notified_at")
    list_filter = ("team", "month")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

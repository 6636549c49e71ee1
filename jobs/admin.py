"""Django admin: clusters, teams and quotas, windows, tokens; jobs are read-only here."""

from django.contrib import admin

from jobs.models import ApiToken, Attempt, Cluster, Job, JobEvent, Membership, ScheduleWindow, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "gpu_quota", "default_cluster", "window")
    inlines = [MembershipInline]


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "enabled")


@admin.register(ScheduleWindow)
class ScheduleWindowAdmin(admin.ModelAdmin):
    list_display = ("name", "timezone", "spec")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")


class AttemptInline(admin.TabularInline):
    model = Attempt
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
    list_display = ("id", "name", "team", "user", "status", "gpus", "submitted_at")
    list_filter = ("status", "team", "cluster")
    search_fields = ("name", "run_id")
    readonly_fields = [f.name for f in Job._meta.fields]
    inlines = [AttemptInline, EventInline]

    def has_add_permission(self, request) -> bool:
        return False  # jobs are submitted through the API, which runs the checks

"""The audit log in the Django admin: read-only (no add, change or delete, for anyone), so the
admin is one more reader of the rows and never a way to change them. Registered by `jobs.apps`."""

from django.contrib import admin

from jobs.audited import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ("time", "actor", "token", "door", "action", "target", "team", "address")
    list_filter = ("door", "action")
    search_fields = ("actor", "target", "team")
    date_hierarchy = "time"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

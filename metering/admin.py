"""Usage records in the Django admin: read-only; they change only by metering attempts."""

from django.contrib import admin

from metering.models import UsageRecord
from metering.prices import shown


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = (
        "day", "team", "user", "cluster", "gpu_type", "gpu_hours", "cost", "deleted_gpu_us",
    )  # fmt: skip
    list_filter = ("team", "cluster", "gpu_type")
    date_hierarchy = "day"

    @admin.display(description="GPU-hours")
    def gpu_hours(self, record: UsageRecord) -> str:
        return f"{record.gpu_us / 3_600_000_000:.3f}"

    @admin.display(description="cost")
    def cost(self, record: UsageRecord) -> str:
        return shown(record.cost_micros)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

"""The OpenAPI operation ids are pinned: moving a router to another module must not rename them
(generated clients and the CLI's error messages name operations by id)."""

from starforge.api import api

PINNED = {
    ("GET", "/api/v1/usage/export"): "metering_api_usage_export",
    ("GET", "/api/v1/prices"): "metering_api_prices",
    ("POST", "/api/v1/prices"): "metering_api_add_price",
    ("PUT", "/api/v1/teams/{name}/budget"): "metering_api_set_budget",
    ("GET", "/api/v1/audit"): "jobs_api_audit_list_audit",
    ("GET", "/api/v1/audit.csv"): "jobs_api_audit_audit_csv",
    ("GET", "/api/v1/audit/{entry_id}"): "jobs_api_audit_get_audit",
    ("DELETE", "/api/v1/jobs/{job_id}/idle-exemption"): "jobs_api_policies_lift_exemption",
    ("GET", "/api/v1/teams/{name}/activity-policy"): "jobs_api_policies_get_policy",
    ("PATCH", "/api/v1/teams/{name}/activity-policy"): "jobs_api_policies_set_policy",
    ("POST", "/api/v1/jobs/{job_id}/idle-exemption"): "jobs_api_policies_exempt_job",
    ("DELETE", "/api/v1/jobs/{job_id}"): "jobs_api_delete_job",
    ("DELETE", "/api/v1/teams/{name}/clusters/{cluster}"): "jobs_teams_api_revoke_cluster",
    ("DELETE", "/api/v1/teams/{name}/members/{username}"): "jobs_teams_api_remove_member",
    ("DELETE", "/api/v1/tokens/{token_id}"): "jobs_tokens_api_revoke_token",
    ("DELETE", "/api/v1/webhooks/{webhook_id}"): "jobs_webhooks_api_remove_webhook",
    ("GET", "/api/v1/arrays"): "jobs_arrays_api_list_arrays",
    ("GET", "/api/v1/arrays/{array_id}"): "jobs_arrays_api_get_array",
    ("GET", "/api/v1/ingest/snapshot"): "jobs_api_ingest_snapshot",
    ("GET", "/api/v1/jobs"): "jobs_api_list_jobs",
    ("GET", "/api/v1/jobs/{job_id}"): "jobs_api_get_job",
    ("GET", "/api/v1/jobs/{job_id}/attempts"): "jobs_api_job_attempts",
    ("GET", "/api/v1/jobs/{job_id}/diagnostics"): "jobs_api_job_diagnostics",
    ("GET", "/api/v1/jobs/{job_id}/events"): "jobs_api_job_events",
    ("GET", "/api/v1/jobs/{job_id}/logs"): "jobs_api_job_logs",
    ("GET", "/api/v1/jobs/{job_id}/logs/download"): "jobs_api_download_logs",
    ("GET", "/api/v1/jobs/{job_id}/metrics"): "jobs_metrics_api_job_metrics",
    ("GET", "/api/v1/me"): "jobs_api_me",
    ("GET", "/api/v1/teams"): "jobs_teams_api_list_teams",
    ("GET", "/api/v1/teams/{name}"): "jobs_teams_api_get_team",
    ("GET", "/api/v1/teams/{name}/inherited-jobs"): "jobs_teams_api_inherited_jobs",
    ("GET", "/api/v1/tokens"): "jobs_tokens_api_list_tokens",
    ("GET", "/api/v1/usage"): "metering_api_usage",
    ("GET", "/api/v1/webhooks"): "jobs_webhooks_api_list_webhooks",
    ("GET", "/api/v1/webhooks/{webhook_id}"): "jobs_webhooks_api_get_webhook",
    ("PATCH", "/api/v1/teams/{name}"): "jobs_teams_api_set_defaults",
    ("PATCH", "/api/v1/teams/{name}/members/{username}"): "jobs_teams_api_change_role",
    ("POST", "/api/v1/arrays"): "jobs_arrays_api_submit_array",
    ("POST", "/api/v1/arrays/{array_id}/{verb}"): "jobs_arrays_api_act_on_array",
    ("POST", "/api/v1/ingest/activity"): "jobs_api_activity_ingest_activity",
    ("POST", "/api/v1/ingest/checkpoint"): "jobs_api_ingest_checkpoint",
    ("POST", "/api/v1/ingest/dumps"): "jobs_api_activity_ingest_dumps",
    ("POST", "/api/v1/ingest/logs"): "jobs_api_ingest_logs",
    ("POST", "/api/v1/ingest/metrics"): "jobs_metrics_api_ingest_metrics",
    ("POST", "/api/v1/ingest/started"): "jobs_api_ingest_started",
    ("POST", "/api/v1/ingest/token"): "jobs_api_exchange_bootstrap",
    ("POST", "/api/v1/jobs"): "jobs_api_submit",
    ("POST", "/api/v1/jobs/{job_id}/pause"): "pause_job",
    ("POST", "/api/v1/jobs/{job_id}/resume"): "resume_job",
    ("POST", "/api/v1/jobs/{job_id}/retry"): "retry_job",
    ("POST", "/api/v1/jobs/{job_id}/stop"): "stop_job",
    ("POST", "/api/v1/snapshots"): "jobs_api_upload_snapshot",
    ("POST", "/api/v1/teams/{name}/clusters"): "jobs_teams_api_grant_cluster",
    ("POST", "/api/v1/teams/{name}/members"): "jobs_teams_api_add_member",
    ("POST", "/api/v1/tokens"): "jobs_tokens_api_create_token",
    ("POST", "/api/v1/webhooks"): "jobs_webhooks_api_add_webhook",
    ("POST", "/api/v1/webhooks/{webhook_id}/test"): "jobs_webhooks_api_test_webhook",
}


def test_every_operation_keeps_its_pinned_id():
    schema = api.get_openapi_schema()
    found = {
        (method.upper(), path): operation["operationId"]
        for path, methods in schema["paths"].items()
        for method, operation in methods.items()
    }
    assert found == PINNED

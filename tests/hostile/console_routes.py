"""The console's routes with arguments, for the hostile walks over the whole URL map (CSRF in
test_console_security, no cached secret in test_secret_answers_not_cached)."""

# Arguments for every console route; a route added without an entry fails the walk.
ROUTE_ARGS = {
    "job-list": {},
    "job-detail": {"job_id": "JOB"},
    "job-action": {"job_id": "JOB", "verb": "stop"},
    "states": {},
    "usage": {},
    "audit": {},
    "metrics": {},
    "teams": {},
    "team-detail": {"name": "vision"},
    "team-member-add": {"name": "vision"},
    "team-member-role": {"name": "vision", "username": "bob"},
    "team-member-remove": {"name": "vision", "username": "bob"},
    "team-defaults": {"name": "vision"},
    "tokens": {},
    "token-revoke": {"token_id": "TOKEN"},
    "array-detail": {"array_id": "ARRAY"},
    "array-action": {"array_id": "ARRAY", "verb": "stop"},
    "compare": {},
    "notifications": {},
    "notification-add": {},
    "notification-test": {"webhook_id": "HOOK"},
    "notification-remove": {"webhook_id": "HOOK"},
    "oidc_authentication_init": {},
    "oidc_authentication_callback": {},
    "login": {},
    "logout": {},
    "password_change": {},
    "password_change_done": {},
    "password_reset": {},
    "password_reset_done": {},
    "password_reset_confirm": {"uidb64": "MQ", "token": "set-password"},
    "password_reset_complete": {},
}


def fill(kwargs: dict, ids: dict) -> dict:
    return {k: ids.get(v, v) for k, v in kwargs.items()}

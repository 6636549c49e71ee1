from django.contrib import admin
from django.contrib.staticfiles.views import serve as serve_static
from django.urls import include, path, re_path
from sf.contract import TRACKING_PATH

from jobs import throttle
from jobs.api import mlflow
from jobs.api.prometheus import metrics_view
from jobs.console import arrays, audit, compare, notify, teams, views
from metering.views import usage_page
from starforge.api import api

urlpatterns = [
    # First: most requests are the API's, and Django tries the patterns in order.
    path("api/", api.urls),
    # MLflow's REST API for the official client, jobs' and members' (jobs.api.mlflow): every
    # path below the root answers in MLflow's shape, an unknown one ENDPOINT_NOT_FOUND.
    re_path(rf"^{TRACKING_PATH.strip('/')}/(?P<path>.*)$", mlflow.endpoint),
    path("", views.job_list, name="job-list"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/<str:verb>/", views.job_action, name="job-action"),
    path("arrays/<int:array_id>/", arrays.array_detail, name="array-detail"),
    path("arrays/<int:array_id>/<str:verb>/", arrays.array_action, name="array-action"),
    path("compare/", compare.compare, name="compare"),
    path("states/", views.states_help, name="states"),
    path("usage/", usage_page, name="usage"),
    path("audit/", audit.audit_page, name="audit"),
    path("metrics", metrics_view, name="metrics"),
    path("teams/", teams.team_list, name="teams"),
    path("teams/<slug:name>/", teams.team_detail, name="team-detail"),
    path("teams/<slug:name>/members/", teams.member_add, name="team-member-add"),
    path(
        "teams/<slug:name>/members/<str:username>/role/",
        teams.member_role,
        name="team-member-role",
    ),
    path(
        "teams/<slug:name>/members/<str:username>/remove/",
        teams.member_remove,
        name="team-member-remove",
    ),
    path("teams/<slug:name>/defaults/", teams.team_defaults, name="team-defaults"),
    path("tokens/", views.token_list, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
    path("notifications/", notify.notification_list, name="notifications"),
    path("notifications/add/", notify.notification_add, name="notification-add"),
    path(
        "notifications/<int:webhook_id>/test/",
        notify.notification_test,
        name="notification-test",
    ),
    path(
        "notifications/<int:webhook_id>/remove/",
        notify.notification_remove,
        name="notification-remove",
    ),
    # The console's own assets (Plotly's bundle included) are served by the app: it works
    # with no internet access and without a separate web server.
    re_path(r"^static/(?P<path>.*)$", serve_static, {"insecure": True}),
    # Identities (issue 51): the OpenID provider's sign-in and callback (jobs.oidc, 404 while
    # not configured); SCIM 2.0 provisioning for the IdP's client (jobs.scim).
    path("oidc/", include("jobs.oidc")),
    path("scim/v2/", include(("jobs.scim_urls", "scim"), namespace="scim")),
    path("accounts/login/", throttle.login, name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/login/", throttle.sign_in_view(admin.site.login)),
    path("admin/", admin.site.urls),
]

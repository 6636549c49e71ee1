from django.contrib import admin
from django.contrib.staticfiles.views import serve as serve_static
from django.urls import include, path, re_path

from jobs import views
from jobs.prometheus import metrics_view
from metering.views import usage_page
from starforge.api import api

urlpatterns = [
    path("", views.job_list, name="job-list"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/<str:verb>/", views.job_action, name="job-action"),
    path("states/", views.states_help, name="states"),
    path("usage/", usage_page, name="usage"),
    path("metrics", metrics_view, name="metrics"),
    path("tokens/", views.token_list, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
    # The console's own assets (Plotly's bundle included) are served by the app: it works
    # with no internet access and without a separate web server.
    re_path(r"^static/(?P<path>.*)$", serve_static, {"insecure": True}),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
]

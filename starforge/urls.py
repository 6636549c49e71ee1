from django.contrib import admin
from django.urls import path

from jobs import views
from starforge.api import api

urlpatterns = [
    path("", views.job_list, name="job-list"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
]

"""A stand-in for the server's MLflow routes (a URLconf for `settings.ROOT_URLCONF`): every
request below /mlflow/ answers what it saw (method, path, credential, body), in front of the
real routes, so a test can tell what a job's tracking request looked like when it reached the
server through the runner's forwarder."""

import json

from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from starforge.urls import urlpatterns as real


@csrf_exempt
def echo(request, rest: str) -> JsonResponse:
    return JsonResponse(
        {
            "method": request.method,
            "path": request.path,
            "authorization": request.headers.get("Authorization", ""),
            "body": json.loads(request.body or b"null"),
        }
    )


urlpatterns = [path("mlflow/<path:rest>", echo), *real]

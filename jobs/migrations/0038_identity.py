"""Issue 51: identities from an OpenID provider and SCIM."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0037_audit"),
    ]

    operations: list = []

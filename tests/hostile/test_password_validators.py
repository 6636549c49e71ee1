"""No door sets a weak password (issue 47, point 8): Django's validators are on in every settings
module (at least 12 characters, not a common one, not all digits, not like the user's name or
address), and every form and command that sets a password applies them. Before, a user could
set the password `1`, under the production settings too."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from jobs.bootstrap import ensure_demo

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
# Each refused for another reason: short, common, all digits, like the user's own address.
WEAK = ["1", "password1234", "739201846392", "alice@example.com1"]
STRONG = "plum-kettle-orbit-42"
VALIDATORS = [
    "django.contrib.auth.password_validation.UserAttributeSimilarityValidator",
    "django.contrib.auth.password_validation.MinimumLengthValidator",
    "django.contrib.auth.password_validation.CommonPasswordValidator",
    "django.contrib.auth.password_validation.NumericPasswordValidator",
]
PRODUCTION = {
    "DJANGO_SETTINGS_MODULE": "starforge.settings_prod",
    "SF_SECRET_KEY": "k" * 20 + "0123456789abcdefghijABCDEFGHIJ-_",
    "SF_ALLOWED_HOSTS": "starforge.example.com",
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",
    "REDIS_URL": "redis://:a-password-of-its-own@127.0.0.1:6379/0",
}
SHOW = (
    "from django.conf import settings; "
    "print([(v['NAME'], v.get('OPTIONS')) for v in settings.AUTH_PASSWORD_VALIDATORS])"
)


@pytest.fixture
def alice_signed_in(alice) -> Client:
    alice.email = "alice@example.com"
    alice.save()
    browser = Client()
    browser.force_login(alice)
    return browser


@pytest.fixture
def staff_signed_in(make_user) -> Client:
    admin = make_user("root-admin")
    User.objects.filter(pk=admin.pk).update(is_staff=True, is_superuser=True)
    browser = Client()
    browser.force_login(User.objects.get(pk=admin.pk))
    return browser


@pytest.mark.parametrize("module", ["starforge.settings", "starforge.settings_prod"])
def test_every_settings_module_turns_the_validators_on(module):
    base = {k: v for k, v in os.environ.items() if not k.startswith("SF_")}
    env = {**base, **PRODUCTION, "DJANGO_SETTINGS_MODULE": module}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c", SHOW],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    shown = done.stdout.strip()
    assert all(name in shown for name in VALIDATORS), shown
    assert "{'min_length': 12}" in shown


@pytest.mark.parametrize("weak", WEAK)
def test_a_weak_password_is_refused(alice, weak):
    alice.email = "alice@example.com"
    with pytest.raises(ValidationError):
        validate_password(weak, alice)
    validate_password(STRONG, alice)


@pytest.mark.parametrize("weak", WEAK)
def test_the_consoles_password_change_refuses_a_weak_password(alice_signed_in, alice, weak):
    answer = alice_signed_in.post(
        "/accounts/password_change/",
        {"old_password": "pw", "new_password1": weak, "new_password2": weak},
    )
    assert answer.status_code == 200 and answer.context["form"].errors["new_password2"]
    assert User.objects.get(pk=alice.pk).check_password("pw")
    changed = alice_signed_in.post(
        "/accounts/password_change/",
        {"old_password": "pw", "new_password1": STRONG, "new_password2": STRONG},
    )
    assert changed.status_code == 302
    assert User.objects.get(pk=alice.pk).check_password(STRONG)


def test_a_password_reset_refuses_a_weak_password(alice):
    uid = urlsafe_base64_encode(force_bytes(alice.pk))
    browser = Client()
    asked = browser.get(f"/accounts/reset/{uid}/{default_token_generator.make_token(alice)}/")
    assert asked.status_code == 302  # to the form at .../set-password/, the token in the session
    answer = browser.post(asked["Location"], {"new_password1": "1", "new_password2": "1"})
    assert answer.status_code == 200 and answer.context["form"].errors["new_password2"]
    assert User.objects.get(pk=alice.pk).check_password("pw")


def test_the_admin_refuses_a_weak_password_for_a_new_user(staff_signed_in):
    answer = staff_signed_in.post(
        "/admin/auth/user/add/",
        {"username": "mallory", "usable_password": "true", "password1": "1", "password2": "1"},
    )
    assert answer.status_code == 200
    assert not User.objects.filter(username="mallory").exists()


def test_the_admin_refuses_a_weak_password_for_an_existing_user(staff_signed_in, alice):
    answer = staff_signed_in.post(
        f"/admin/auth/user/{alice.pk}/password/",
        {"usable_password": "true", "password1": "1", "password2": "1"},
    )
    assert answer.status_code == 200 and answer.context["form"].errors
    assert User.objects.get(pk=alice.pk).check_password("pw")


def test_createsuperuser_refuses_a_weak_password_from_the_environment(monkeypatch):
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "1")
    with pytest.raises(CommandError, match="DJANGO_SUPERUSER_PASSWORD is refused"):
        call_command("createsuperuser", "--noinput", "--username", "ops", "--email", "")
    assert not User.objects.filter(username="ops").exists()
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", STRONG)
    call_command("createsuperuser", "--noinput", "--username", "ops", "--email", "")
    assert User.objects.get(username="ops").check_password(STRONG)


def test_the_demo_users_own_password_passes_the_validators(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    demo = ensure_demo()
    assert demo.password
    validate_password(demo.password, User.objects.get(username="demo"))

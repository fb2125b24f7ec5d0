"""Runtime settings over the API and in the admin: the same checks, messages and audit
rows as `manage.py config` (core/runtime.py)."""

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from queue_app.conf import settings as queue_settings
from queue_app.models import RuntimeSetting, SettingChange
from queue_app.web import auth

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator():
    _, raw = auth.create("ops", scopes=["read", "operate"])
    return {"HTTP_X_API_KEY": raw}


def test_the_api_sets_lists_and_unsets_a_setting_with_its_audit_row(client, operator):
    response = client.put(
        "/api/config/aging-interval", {"value": "1m"}, content_type="application/json", **operator
    )
    assert response.status_code == 200, response.content
    assert response.json()["value"] == 60.0
    assert queue_settings.AGING_INTERVAL == 60.0
    listed = {row["name"]: row for row in client.get("/api/config", **operator).json()}
    assert (listed["aging-interval"]["source"], listed["aging-interval"]["configured"]) == ("store", 30.0)
    assert client.delete("/api/config/aging-interval", **operator).status_code == 200
    assert client.delete("/api/config/aging-interval", **operator).status_code == 404
    trail = list(SettingChange.objects.order_by("id").values_list("old", "new", "actor"))
    assert trail == [(30.0, 60.0, "api-key:ops"), (60.0, 30.0, "api-key:ops")]


def test_the_api_refuses_a_bad_value_with_the_settings_checks_message(client, operator):
    response = client.put(
        "/api/config/max-attempts", {"value": 5000}, content_type="application/json", **operator
    )
    assert response.status_code == 400
    assert response.json()["error"].startswith(
        'JOBQUEUE["DEFAULT_MAX_ATTEMPTS"] must be a whole number in 1..1000'
    )
    assert not SettingChange.objects.exists()


def test_the_admin_sets_and_deletes_through_the_audited_path(client):
    client.force_login(get_user_model().objects.create_superuser("root", password="pw"))
    add = reverse("admin:queue_app_runtimesetting_add")
    refused = client.post(add, {"name": "LEASE_SECONDS", "value": "0"})
    assert "JOBQUEUE[&quot;LEASE_SECONDS&quot;] must be more than 0" in refused.content.decode()
    client.post(add, {"name": "LEASE_SECONDS", "value": "45s"})
    assert RuntimeSetting.objects.get().value == 45.0
    delete = reverse("admin:queue_app_runtimesetting_delete", args=["LEASE_SECONDS"])
    client.post(delete, {"post": "yes"})
    assert not RuntimeSetting.objects.exists()
    trail = list(SettingChange.objects.order_by("id").values_list("old", "new", "actor"))
    assert trail == [(30.0, 45.0, "root"), (45.0, 30.0, "root")]
    assert client.get(reverse("admin:queue_app_settingchange_changelist")).status_code == 200

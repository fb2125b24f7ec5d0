"""The operator's kit in deploy/: the Prometheus alert rules valid (`promtool check rules`)
and firing as their unit tests expect on recorded series (`promtool test rules`); the
rules and the Grafana dashboard naming only metrics that /metrics exports."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.factories import DeadLetterFactory, JobFactory

PROMTOOL = shutil.which("promtool")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus"
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)"
)


def promtool(*args):
    return subprocess.run([PROMTOOL, *args], cwd=RULES, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_the_alert_rules():
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
def test_the_alert_rules_fire_as_their_unit_tests_expect():
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def exported_names(text):
    """Every sample name /metrics exposes (counters as name_total, histograms' series too)."""
    return {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }


@pytest.mark.django_db
def test_the_alert_rules_name_only_metrics_that_metrics_exports(client):
    JobFactory(kind="echo")
    DeadLetterFactory(job__kind="boom")
    exported = exported_names(client.get("/metrics").content.decode())
    used = set(re.findall(r"\bjobqueue_[a-z_]+", (RULES / "alerts.yml").read_text()))
    assert used and used <= exported, sorted(used - exported)
    # The unit tests' series are what /metrics would send, or they test nothing real.
    series = set(re.findall(r"\bjobqueue_[a-z_]+", (RULES / "alerts_test.yml").read_text()))
    assert series <= exported, sorted(series - exported)


@pytest.mark.django_db
def test_the_dashboards_queries_name_only_metrics_that_metrics_exports(client):
    JobFactory(kind="echo")
    exported = exported_names(client.get("/metrics").content.decode())
    dashboard = json.loads((DEPLOY / "grafana" / "jobqueue.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = set(re.findall(r"\bjobqueue_[a-z_]+", " ".join(exprs)))
    assert len(used) >= 5 and used <= exported, sorted(used - exported)

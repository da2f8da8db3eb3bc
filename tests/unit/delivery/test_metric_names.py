"""The shipped dashboard and alert rules query only metrics the service exports.

Every ``wfjobs_*`` name in a PromQL expression of ``docker/grafana`` and
``docker/prometheus`` must be a family of ``streams.metrics.CATALOGUE`` (or a
sample of one: ``_bucket``, ``_count``, ``_sum`` of a histogram), and every
label it selects on must be one that family has. A metric renamed in the code
then fails here instead of leaving an empty panel or an alert that can never
fire.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from streams.metrics import SPECS, exported_family

DOCKER = Path(__file__).resolve().parents[3] / "docker"
DASHBOARD = DOCKER / "grafana" / "workflow-jobs-dashboard.json"
ALERTS = DOCKER / "prometheus" / "alerts.yaml"

# A metric name, and the label matchers of its selector when it has one.
SELECTOR = re.compile(r"\b(?P<name>wfjobs_[a-z0-9_]+)\b(?:\{(?P<matchers>[^}]*)\})?")
MATCHER_LABEL = re.compile(r"(?P<label>[a-z_]+)\s*(?:=~|!~|!=|=)")
# Labels Prometheus adds when it scrapes (and the histogram's own).
SCRAPE_LABELS = {"instance", "job", "le"}


def _dashboard_expressions() -> Iterator[str]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            for target in panel.get("targets", []):
                yield target["expr"]
            yield from walk(panel.get("panels", []))

    yield from walk(json.loads(DASHBOARD.read_text())["panels"])


def _alert_expressions() -> Iterator[str]:
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            yield rule["expr"]


def _check(expression: str) -> set[str]:
    names = set()
    for match in SELECTOR.finditer(expression):
        sample = match["name"]
        family = exported_family(sample)
        assert family in SPECS, f"{sample} in {expression!r} is not a metric the service exports"
        spec = SPECS[family]
        if sample != family:
            assert spec.kind == "histogram", f"{sample}: {family} is a {spec.kind}"
        for label in MATCHER_LABEL.findall(match["matchers"] or ""):
            assert label in spec.labels or label in SCRAPE_LABELS, (
                f"{family} has no label {label!r} ({expression!r})"
            )
        names.add(family)
    # ``by (...)`` may only name labels the expression's metrics have.
    for grouping in re.findall(r"by \(([^)]*)\)", expression):
        for label in (part.strip() for part in grouping.split(",")):
            assert label in SCRAPE_LABELS or any(label in SPECS[n].labels for n in names), (
                f"grouping by {label!r} in {expression!r}"
            )
    return names


def test_every_dashboard_query_names_exported_metrics() -> None:
    expressions = list(_dashboard_expressions())
    assert expressions
    used: set[str] = set()
    for expression in expressions:
        found = _check(expression)
        assert found, f"a panel queries no workflow-jobs metric: {expression!r}"
        used |= found
    # The dashboard shows every metric there is.
    assert used == set(SPECS), sorted(set(SPECS) - used)


def test_every_alert_rule_names_exported_metrics() -> None:
    rules = list(_alert_expressions())
    assert len(rules) >= 3
    used: set[str] = set()
    for expression in rules:
        found = _check(expression)
        assert found, expression
        used |= found
    # The three the product promises: a stuck relay, a growing backlog, DEAD jobs.
    assert {
        "wfjobs_outbox_pending_oldest_age_seconds",
        "wfjobs_queued_oldest_age_seconds",
        "wfjobs_jobs",
        "wfjobs_jobs_settled_total",
        "wfjobs_swept_jobs_total",
    } <= used


def test_the_check_catches_a_misspelt_metric_and_label() -> None:
    for wrong in ("rate(wfjobs_jobs_setled_total[5m])", 'wfjobs_jobs{state="QUEUED"}'):
        try:
            _check(wrong)
        except AssertionError:
            continue
        raise AssertionError(f"{wrong!r} was not caught")

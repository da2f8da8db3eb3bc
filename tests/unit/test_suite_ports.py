"""The suite's processes draw server ports from slices that never overlap."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

import devstack.processes
from devstack.processes import free_port
from tests.conftest import _confine_server_ports


def _slice_of(monkeypatch: pytest.MonkeyPatch, config: Any) -> range:
    monkeypatch.setattr(devstack.processes, "_SERVER_PORTS", range(20000, 32768))
    _confine_server_ports(cast(pytest.Config, config))
    ports = devstack.processes._SERVER_PORTS
    assert ports.start >= 20000 and ports.stop <= 32768 and len(ports) > 1000
    assert free_port() in ports
    return ports


def test_each_xdist_worker_and_the_controller_draw_from_their_own_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workers = [
        SimpleNamespace(workerinput={"workerid": f"gw{index}", "workercount": 3})
        for index in range(3)
    ]
    controller = SimpleNamespace(
        option=SimpleNamespace(numprocesses=3, dist="loadfile"),
        getoption=lambda name: False,
    )
    slices = [set(_slice_of(monkeypatch, config)) for config in [*workers, controller]]
    for index, ports in enumerate(slices):
        for other in slices[index + 1 :]:
            assert not ports & other

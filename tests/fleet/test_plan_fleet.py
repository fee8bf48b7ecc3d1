"""`gmlx plan --hosts H`: the least-connections split of a wave, what a fleet admits at once, the fleet
simulation (the real fleet's admissions are checked in tests/fleet/test_fleet.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gmlx_plan.cli import main
from gmlx_plan.fleet import FleetAdmission, shares, simulate_fleet
from gmlx_plan.queueing import Rates
from gmlx_plan.simulate import ServerSide, Workload, simulate
from tests.conftest import smollm2_path

RATES = Rates(decode_tok_s=20.0, prefill_tok_s=200.0, batch_scaling=0.9)


def test_a_wave_is_split_as_least_connections_would() -> None:
    assert shares(16, 3) == (6, 5, 5) and shares(2, 3) == (1, 1, 0) and shares(9, 1) == (9,)


@given(st.integers(0, 200), st.integers(1, 12), st.integers(0, 8), st.integers(0, 16))
def test_admission_counts_add_up(width: int, hosts: int, slots: int, cap: int) -> None:
    a = FleetAdmission(hosts, width, slots, cap)
    assert a.start + a.wait + a.refused == width and min(a.start, a.wait, a.refused) >= 0
    assert a.refused == max(0, width - a.capacity)  # an even split fills every host before any refuses


def test_a_simultaneous_wave_is_admitted_as_the_server_admits() -> None:
    """Each host starts its decode slots and queues up to its cap (requests beyond free slots): slots + cap."""
    server = ServerSide(decode_batch=2, queue_cap=2)
    fits = simulate(Workload(1, 4, 64, 8), server, RATES)
    assert not any(o.retry_afters for o in fits.outcomes)
    over = simulate(Workload(1, 5, 64, 8), server, RATES)
    assert sum(bool(o.retry_afters) for o in over.outcomes) == 1


def test_the_fleet_simulation_is_its_hosts_put_together() -> None:
    server, work = ServerSide(decode_batch=2, queue_cap=2), Workload(1, 16, 64, 8)
    one = simulate_fleet(work, server, RATES, 1)
    assert one == simulate(work, server, RATES)
    fleet = simulate_fleet(work, server, RATES, 3)
    assert len(fleet.outcomes) == 16 and all(o.status == "completed" for o in fleet.outcomes)
    refused_first = sum(bool(o.retry_afters) for o in fleet.outcomes)
    assert refused_first == FleetAdmission(3, 16, 2, 2).refused == 4
    assert fleet.drain_s < one.drain_s  # three hosts drain the wave sooner than one


def test_plan_hosts_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", smollm2_path(), "--width", "16", "--depth", "512", "--decode-batch", "2",
            "--queue-cap", "2", "--hosts", "3"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fleet"] == {"hosts": 3, "width": 16, "per_host": [6, 5, 5], "slots_per_host": 2,
                            "queue_cap_per_host": 2, "capacity": 12, "start_now": 6, "wait": 6, "refused_503": 4}
    assert out["plan"]["width"] == 16 and out["plan"]["width_read"] == 8  # each host holds its 6 streams
    assert main(argv) == 0
    assert "3 hosts x 2 slots + queue cap 2 take 12 requests at once" in capsys.readouterr().out
    sim = ["plan", "simulate", "--model", smollm2_path(), "--width", "16", "--depth", "64", "--output-tokens", "8",
           "--decode-batch", "2", "--queue-cap", "2", "--hosts", "3", "--decode-tok-s", "20", "--prefill-tok-s",
           "200", "--json"]
    assert main(sim) == 0
    summary = json.loads(capsys.readouterr().out)["simulation"]
    assert summary["fleet"]["refused_503"] == 4 and summary["requests"] == 16 and summary["completed"] == 16
    assert main(["plan", "--model", smollm2_path(), "--width", "4", "--depth", "64", "--hosts", "0"]) == 2
    assert "--hosts 0" in capsys.readouterr().err

"""The container provider passes the executor conformance kit, check by check."""

from __future__ import annotations

import pytest
import trio

from ficc_core.testing import executor_kit as kit

# Every test here needs the locally built image.
pytestmark = pytest.mark.slow


async def test_readiness_gates_the_attempt_and_times_out(provider):
    with trio.fail_after(60):
        await kit.check_readiness(provider)


async def test_an_engine_that_exits_is_reported_with_status_and_log_tail(provider):
    with trio.fail_after(60):
        await kit.check_exit_reported(provider)


async def test_the_engine_cannot_reach_the_hosts_loopback_or_any_address(provider):
    with trio.fail_after(60):
        await kit.check_network_isolation(provider)


async def test_stale_fences_foreign_paths_and_extra_headers_are_refused(provider):
    with trio.fail_after(60):
        await kit.check_fences_and_contract(provider)


async def test_a_reader_that_does_not_read_blocks_the_engine(provider):
    with trio.fail_after(60):
        await kit.check_endpoint_backpressure(provider)


async def test_cancel_is_seen_by_the_engine_within_100_ms(provider):
    with trio.fail_after(60):
        latency = await kit.check_cancel(provider)
    assert latency <= 0.1


async def test_only_an_admitted_input_file_can_feed_the_upload_route(provider):
    with trio.fail_after(60):
        await kit.check_input_upload(provider)


async def test_an_engine_on_loopback_tcp_is_reached_inside_its_namespace(provider):
    with trio.fail_after(60):
        await kit.check_tcp_transport(provider)


async def test_logs_have_tail_and_follow(provider):
    with trio.fail_after(60):
        await kit.check_logs(provider)


async def test_stop_terminates_then_kills(provider):
    with trio.fail_after(60):
        await kit.check_clean_stop(provider)


async def test_memory_and_cpu_limits_are_enforced(provider):
    with trio.fail_after(90):
        await kit.check_limits(provider)

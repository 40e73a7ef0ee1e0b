"""Dask's tests that hard-code tcp:// or Dask's TCP classes, skipped over ordo by
ordo_dask_plugin.py: file::test -> why. Each was read: none runs ordo in a way that a
difference could show."""
_RESULT = "asserts that a scheme-less address becomes tcp://, not the default scheme"
_TCP_ADDRESS = "asserts that an address starts with tcp://"
_LOCKED = "utils_test._LockedCommPool wraps Dask's TCP comm only (asserts isinstance(comm, TCP))"

TCP_ONLY: dict[str, str] = {
    # distributed/comm/tests/test_comms.py
    "test_comms.py::test_resolve_address[tornado]": _RESULT,
    "test_comms.py::test_resolve_address[asyncio]": _RESULT,
    "test_comms.py::test_tcp_many_listeners[asyncio]":
        "listens on tcp:// addresses only (ordo is not involved; upstream reruns it twice)",
    "test_comms.py::test_tcp_many_listeners[tornado]":
        "listens on tcp:// addresses only (ordo is not involved; upstream reruns it twice)",
    # distributed/tests/test_core.py
    "test_core.py::test_server": "asserts a Server's address starts with tcp://",
    "test_core.py::test_rpc_inputs": "builds an rpc to a tcp:// address and asserts all match",
    "test_core.py::test_coerce_to_address": _RESULT,
    "test_core.py::test_connection_pool": "reads ConnectionPool.available by a tcp:// key",
    "test_core.py::test_close_properly":
        "connects with tcp:// to a server that listens on the default scheme",
    "test_core.py::test_async_listener_stop":
        "replaces the tcp backend and expects its listener on the default scheme",
    # distributed/tests/test_worker.py
    "test_worker.py::test_gather_missing_workers": _TCP_ADDRESS,
    "test_worker.py::test_gather_missing_workers_replicated[False]": _TCP_ADDRESS,
    "test_worker.py::test_gather_missing_workers_replicated[True]": _TCP_ADDRESS,
    "test_worker.py::test_interface_async[Worker]": _TCP_ADDRESS,
    "test_worker.py::test_interface_async[Nanny]": _TCP_ADDRESS,
    "test_worker.py::test_service_hosts_match_worker": _TCP_ADDRESS,
    "test_worker.py::test_heartbeat_missing_real_cluster":
        "asserts that the scheduler's comm to a worker is Dask's TCP comm",
    "test_worker.py::test_task_flight_compute_oserror": _LOCKED,
    # distributed/tests/test_scheduler.py
    "test_scheduler.py::test_coerce_address": _RESULT,
    "test_scheduler.py::test_transition_waiting_memory":
        "asserts that a worker's comm to the scheduler is Dask's TCP comm",
    "test_scheduler.py::test_deadlock_resubmit_queued_tasks_fast[True]":
        "asserts that the scheduler's comm to a worker is Dask's TCP comm",
    "test_scheduler.py::test_deadlock_resubmit_queued_tasks_fast[False]":
        "asserts that the scheduler's comm to a worker is Dask's TCP comm",
}

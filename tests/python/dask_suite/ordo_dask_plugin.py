"""A pytest plugin that runs Debian's copy of Dask's own tests (python3-distributed) as
upstream's root conftest.py does, over the comm scheme in DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME
(run.py sets it: tcp, then ordo). Loaded with ``-p ordo_dask_plugin``.

- Upstream's conftest: Dask's fixtures (distributed.utils_test), tests marked slow skipped.
- distributed.comm.core.listen() makes a scheme-less address tcp:// whatever the default
  scheme says; here it takes the default scheme, as connect() and the rpc do, so that a
  Scheduler(host="127.0.0.1") listens on the scheme under test.
- Over ordo, the tests in TCP_ONLY are skipped, each with why.
"""
from __future__ import annotations

import os
import sys

import dask
import pytest

import distributed.comm
import distributed.comm.core
from distributed.utils_test import *  # noqa: F401,F403 - Dask's fixtures, as upstream's conftest

from tcp_only import TCP_ONLY

SCHEME = dask.config.get("distributed.comm.default-scheme")
_listen = distributed.comm.core.listen


def _listen_default_scheme(addr, handle_comm, deserialize=True, **kwargs):
    if isinstance(addr, str) and "://" not in addr and not kwargs.get("ssl_context"):
        addr = f"{SCHEME}://{addr}"
    return _listen(addr, handle_comm, deserialize, **kwargs)


for _name, _mod in list(sys.modules.items()):
    if _name.startswith("distributed") and getattr(_mod, "listen", None) is _listen:
        _mod.listen = _listen_default_scheme


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.skip(reason="slow (upstream's conftest runs them with --runslow only)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(slow)
        elif SCHEME != "tcp":
            why = TCP_ONLY.get(f"{os.path.basename(item.fspath)}::{item.name}")
            if why:
                item.add_marker(pytest.mark.skip(reason=f"tcp only: {why}"))

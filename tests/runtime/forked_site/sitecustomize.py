"""On PYTHONPATH of the processes that tests/conftest.py's `forked_engines` reaches (with TEST_ENGINE_FORK_SERVER
set): their subprocess.Popen forks the reference servers, gateways and reference builds that the product starts
(runtime/supervisor.py, runtime/backends.py) from the test worker's fork server, which has PyTorch and those modules
imported (tests/runtime/zygote.py, forking_popen), instead of paying ~3 s of CPU per process to import them again.
Everything else they start, they start themselves.

Python imports one `sitecustomize`, the first on sys.path: this one runs TEST_CPU_LOG's
(tests/cpu_by_process/sitecustomize.py) too, which does nothing unless its own variable is set."""

import os
import runpy

_TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if os.environ.get("TEST_ENGINE_FORK_SERVER"):
    import importlib.util
    import subprocess

    # By its path: the repository is not on sys.path yet while Python starts (`-m` adds the directory later).
    _spec = importlib.util.spec_from_file_location("_fleetcast_test_zygote", os.path.join(_TESTS, "runtime", "zygote.py"))
    assert _spec is not None and _spec.loader is not None
    _zygote = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_zygote)
    subprocess.Popen = _zygote.forking_popen(os.environ[_zygote.ENGINE_SOCKET_VAR])  # type: ignore[misc]

runpy.run_path(os.path.join(_TESTS, "cpu_by_process", "sitecustomize.py"), run_name="sitecustomize")

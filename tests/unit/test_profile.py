"""Profile loading: malformed profiles (table-driven), good profiles, shipped configs, fuzzing."""
import math
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.errors import ExitCode, ProfileError
from tasks.profile.types import JsonTable, Secret
from helpers import KEYS, VLLM, tomlish
from tasks.profile import find_default_profile, load_profile, resolve_profile_path
from tasks.profile.toml_text import dumps

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

pytestmark = pytest.mark.filterwarnings("error")  # the loader must be warning-free

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
ENV = {"HF_TOKEN": "hf_S3CRET-value-never-shown", "PATH": "/usr/bin"}


def write(d, files):
    for name, text in files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text, encoding="utf-8")


def load(d, files, top="p.toml", environ=ENV):
    write(d, files)
    return load_profile(d / top, environ=environ)


# (id, files, file blamed, key path in message, substring of message). "p.toml" is loaded.
BAD = [
    ("unknown-key", {"p.toml": VLLM + "portt = 8000\n"}, "p.toml", "server.portt", "did you mean 'port'"),
    ("unknown-table", {"p.toml": VLLM + "[servre]\n"}, "p.toml", "servre", "unknown key"),
    ("port-string", {"p.toml": VLLM + 'port = "8000"\n'}, "p.toml", "server.port", 'got string "8000"'),
    ("port-range", {"p.toml": VLLM + "port = 80\n"}, "p.toml", "server.port", "from 1024 to 65535"),
    ("port-bool", {"p.toml": VLLM + "port = true\n"}, "p.toml", "server.port", "got boolean true"),
    ("no-server", {"p.toml": "[target]\n"}, "p.toml", "server", "required key is missing"),
    ("no-engine", {"p.toml": '[server]\nmodel = "/m"\n'}, "p.toml", "server.engine", "required"),
    ("bad-engine", {"p.toml": '[server]\nengine = "tgi"\nmodel = "/m"\n'}, "p.toml", "server.engine",
     '"vllm", "sglang", "command"'),
    ("no-model", {"p.toml": '[server]\nengine = "sglang"\n'}, "p.toml", "server.model", "required"),
    ("no-command", {"p.toml": '[server]\nengine = "command"\n'}, "p.toml", "server.command", "required"),
    ("command-for-vllm", {"p.toml": VLLM + 'command = ["x"]\n'}, "p.toml", "server.command",
     'only for engine = "command"'),
    ("empty-command", {"p.toml": '[server]\nengine = "command"\ncommand = []\n'}, "p.toml",
     "server.command", "at least one"),
    ("bad-json", {"p.toml": VLLM + "[server.args]\nspeculative-config = '{method: \"dflash\"}'\n"},
     "p.toml", "server.args.speculative-config", "line 1 column 2"),
    ("bad-json-any-config", {"p.toml": VLLM + "[server.args]\nfoo_config = '{\"a\": }'\n"},
     "p.toml", "server.args.foo_config", "JSON error"),
    ("json-dup-key", {"p.toml": VLLM + "[server.args]\nhf-overrides = '{\"a\": 1, \"a\": 2}'\n"},
     "p.toml", "server.args.hf-overrides", "duplicate key 'a'"),
    ("nested-array", {"p.toml": VLLM + "[server.args]\nfoo = [[1, 2], [3]]\n"}, "p.toml",
     "server.args.foo[0]", "one argv element per item"),
    ("array-of-tables", {"p.toml": VLLM + "[[server.args.foo]]\na = 1\n"}, "p.toml",
     "server.args.foo[0]", "one argv element per item"),
    ("empty-array-arg", {"p.toml": VLLM + "[server.args]\nfoo = []\n"}, "p.toml", "server.args.foo",
     "at least one item"),
    ("nan-arg", {"p.toml": VLLM + "[server.args]\nfoo = nan\n"}, "p.toml", "server.args.foo", "finite"),
    ("nul-arg", {"p.toml": VLLM + '[server.args]\nfoo = "a\\u0000b"\n'}, "p.toml", "server.args.foo",
     "NUL"),
    ("huge-arg", {"p.toml": VLLM + '[server.args]\nserved-model-name = "' + "m" * 200_000 + '"\n'},
     "p.toml", "server.args.served-model-name", "200000 bytes here"),
    ("huge-env", {"p.toml": VLLM + '[server.env]\nX = "' + "\u00e9" * 70_000 + '"\n'},
     "p.toml", "server.env.X", "140000 bytes here"),
    ("nul-env", {"p.toml": VLLM + '[server.env]\nX = "\\u0000"\n'}, "p.toml", "server.env.X", "NUL"),
    ("nul-command", {"p.toml": '[server]\nengine = "command"\ncommand = ["a", "b\\u0000"]\n'},
     "p.toml", "server.command[1]", "NUL"),
    ("nul-key", {"p.toml": VLLM + '[server.args]\n"a\\u0000" = 1\n'}, "p.toml", 'server.args."a\\u0000"',
     "NUL"),
    ("unset-from-env", {"p.toml": VLLM + '[server.env]\nTOK = { from_env = "NOPE_UNSET" }\n'},
     "p.toml", "server.env.TOK", "export NOPE_UNSET"),
    ("from-env-extra-key", {"p.toml": VLLM + '[server.env]\nTOK = { from_env = "HF_TOKEN", x = 1 }\n'},
     "p.toml", "server.env.TOK.x", "unknown key"),
    ("env-bad-name", {"p.toml": VLLM + '[server.env]\n"1BAD" = "x"\n'}, "p.toml", "server.env.1BAD",
     "environment variable name"),
    ("env-array", {"p.toml": VLLM + '[server.env]\nX = ["a"]\n'}, "p.toml", "server.env.X", "from_env"),
    ("extends-cycle", {"p.toml": 'extends = "b.toml"\n' + VLLM, "b.toml": 'extends = "p.toml"\n'},
     "b.toml", "extends", "p.toml -> "),
    ("extends-self", {"p.toml": 'extends = "p.toml"\n' + VLLM}, "p.toml", "extends", "loop"),
    ("extends-missing", {"p.toml": 'extends = "nope.toml"\n' + VLLM}, "p.toml", "extends", "nope.toml"),
    ("extends-not-string", {"p.toml": "extends = 3\n" + VLLM}, "p.toml", "extends", "integer 3"),
    ("name-dotdot", {"p.toml": '[target]\nname = "../x"\n' + VLLM}, "p.toml", "target.name",
     "deployment name"),
    ("name-too-long", {"p.toml": f'[target]\nname = "{"a" * 101}"\n' + VLLM}, "p.toml", "target.name",
     "at most 100"),
    ("name-from-stem", {"p.toml": VLLM, "bad name.toml": VLLM}, "bad name.toml", "target.name",
     "set [target] name"),
    ("workdir-dotdot", {"p.toml": '[target]\nworkdir = "~/a/../../etc"\n' + VLLM}, "p.toml",
     "target.workdir", "'..'"),
    ("workdir-relative", {"p.toml": '[target]\nworkdir = "llmfab"\n' + VLLM}, "p.toml",
     "target.workdir", "absolute"),
    ("workdir-newline", {"p.toml": '[target]\nworkdir = "/a\\nb"\n' + VLLM}, "p.toml",
     "target.workdir", "control"),
    ("keep-releases-small", {"p.toml": "[target]\nkeep_releases = 1\n" + VLLM}, "p.toml",
     "target.keep_releases", ">= 2"),
    ("host-with-space", {"p.toml": '[target]\nhosts = ["a b"]\n' + VLLM}, "p.toml", "target.hosts[0]",
     "host name"),
    ("toml-syntax", {"p.toml": VLLM + "port = \n"}, "p.toml", None, "line 4"),
    ("not-utf8", {"p.toml": b'[server]\nengine = "\xff"\n'}, "p.toml", None, "UTF-8"),
    ("dash-underscore-dup", {"p.toml": VLLM + "[server.args]\ntensor-parallel-size = 2\n"
                             "tensor_parallel_size = 4\n"}, "p.toml", "server.args.tensor_parallel_size",
     "'tensor-parallel-size'"),
    ("dotted-and-whole", {"p.toml": VLLM + "[server.args]\nspeculative-config = { method = \"mtp\" }\n"
                          '"speculative-config.method" = "x"\n'}, "p.toml",
     'server.args."speculative-config.method"', "'speculative-config'"),
    ("flag-with-dashes", {"p.toml": VLLM + '[server.args]\n"--port" = 1\n'}, "p.toml",
     'server.args.--port', "without leading dashes"),
    ("flag-with-equals", {"p.toml": VLLM + '[server.args]\n"a=b" = 1\n'}, "p.toml",
     'server.args."a=b"', '"="'),
    ("datetime-arg", {"p.toml": VLLM + "[server.args]\nwhen = 1979-05-27T07:32:00Z\n"}, "p.toml",
     "server.args.when", "dates/times"),
    ("datetime-in-table", {"p.toml": VLLM + "[server.args]\nx-config = { t = 07:32:00 }\n"}, "p.toml",
     "server.args.x-config.t", "dates/times"),
    ("args-not-table", {"p.toml": VLLM + 'args = "--x"\n'}, "p.toml", "server.args", "a table"),
    ("server-not-table", {"p.toml": "server = 3\n"}, "p.toml", "server", "got integer 3"),
    ("args-port-conflict", {"p.toml": VLLM + "port = 9000\n[server.args]\nport = 9001\n"}, "p.toml",
     "server.args.port", "same port"),
    # a command server is told --port from [server.args]; readiness probes [server] port
    ("command-port-conflict", {"p.toml": '[target]\nhosts = ["h1"]\n[server]\nengine = "command"\n'
                               'command = ["python3", "s.py"]\nport = 9000\n[server.args]\nport = 9001\n'},
     "p.toml", "server.args.port", "give the command the same"),
    ("files-missing", {"p.toml": VLLM + 'files = ["nope.py"]\n'}, "p.toml", "server.files[0]",
     "existing regular file"),
    ("files-reserved", {"p.toml": VLLM + 'files = ["sub/launch.py"]\n', "sub/launch.py": ""}, "p.toml",
     "server.files[0]", "writes that one itself"),
    ("gpu-dup", {"p.toml": VLLM + "[gpu]\ndevices = [0, 0]\n"}, "p.toml", "gpu.devices[1]", "once"),
    ("gpu-negative", {"p.toml": VLLM + "[gpu]\ndevices = [-1]\n"}, "p.toml", "gpu.devices[0]", ">= 0"),
    ("timeout-zero", {"p.toml": VLLM + "[ready]\ntimeout = 0\n"}, "p.toml", "ready.timeout", "greater than 0"),
    ("health-no-slash", {"p.toml": VLLM + '[ready]\nhealth_path = "health"\n'}, "p.toml",
     "ready.health_path", 'starting with "/"'),
    ("cluster-no-workers", {"p.toml": VLLM + '[cluster]\nbackend = "ray"\n'}, "p.toml", "cluster.workers",
     "required"),
    ("cluster-backend", {"p.toml": VLLM + '[cluster]\nbackend = "slurm"\nworkers = ["h"]\n'}, "p.toml",
     "cluster.backend", '"ray"'),
    # An error written in a base profile points at the base profile.
    ("blame-base", {"p.toml": 'extends = "base/b.toml"\n[server]\nport = 9000\n',
                    "base/b.toml": '[server]\nengine = "vllm"\nmodel = "/m"\nhost = 1\n'},
     "base/b.toml", "server.host", "integer 1"),
    ("dup-across-extends", {"p.toml": 'extends = "b.toml"\n[server.args]\ntensor_parallel_size = 4\n',
                            "b.toml": VLLM + "[server.args]\ntensor-parallel-size = 2\n"},
     "p.toml", "server.args.tensor_parallel_size", "'tensor-parallel-size'"),
]


@pytest.mark.parametrize("files,blamed,key,needle", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_malformed_profile_is_a_profile_error_naming_file_and_key(tmp_path, files, blamed, key, needle):
    top = "bad name.toml" if blamed == "bad name.toml" else "p.toml"
    with pytest.raises(ProfileError) as info:
        load(tmp_path, files, top=top)
    e = info.value
    assert e.code == ExitCode.BAD_INPUT
    assert os.path.normpath(e.path) == os.path.normpath(tmp_path / blamed), e.message
    assert e.message.startswith(f"{e.path}: "), e.message
    if key is not None:
        assert e.key == key and f": {key}: " in e.message, e.message
    assert needle in e.message, e.message
    assert "hf_S3CRET" not in e.message


def test_unreadable_profile(tmp_path):
    (tmp_path / "dir.toml").mkdir()
    for target in (tmp_path / "dir.toml", tmp_path / "missing.toml"):
        with pytest.raises(ProfileError, match="cannot read the profile"):
            load_profile(target)


def test_extends_deep_merge(tmp_path):
    p = load(tmp_path, {
        "base.toml": '[target]\nhosts = ["a", "b"]\nkeep_releases = 3\n' + VLLM + 'port = 9000\n'
                     '[server.args]\nx = 1\ny = [1, 2]\ncfg = { a = 1, b = { c = 2 } }\n'
                     '[server.env]\nA = "1"\n[ready]\ntimeout = 60\n',
        "mid.toml": 'extends = "base.toml"\n[server.args]\nz = "mid"\n',
        "p.toml": 'extends = "mid.toml"\n[target]\nhosts = ["c"]\n[server]\nport = 9001\n'
                  '[server.args]\ny = [3]\ncfg = { b = { d = 4 } }\n[server.env]\nB = "2"\n',
    })
    assert p.target.hosts == ("c",)                   # arrays are replaced, not concatenated
    assert p.target.keep_releases == 3 and p.server.port == 9001 and p.ready.timeout == 60.0
    assert p.server.args == (("x", 1), ("y", (3,)), ("cfg", JsonTable('{"b":{"d":4}}')),
                             ("z", "mid"))            # base order kept, new keys appended;
    # a table-valued flag is one value: the child's replaces the base's whole
    assert p.plain_env() == {"A": "1", "B": "2"}
    assert p.target.name == "p"                       # stem of the file given, not of a base
    assert [f.name for f in p.sources] == ["p.toml", "mid.toml", "base.toml"]
    assert "extends" not in p.resolved_toml


def test_extends_replaces_a_table_valued_flag_whole(tmp_path):
    # Issue 22: an n-gram child over an EAGLE3 base was merged key by key and sent
    # {"method":"ngram","model":"<the EAGLE3 drafter>",...} to the server.
    p = load(tmp_path, {
        "base.toml": VLLM + '[server.args]\nspeculative-config = { method = "eagle3", model = "/m/eagle3", '
                            'num_speculative_tokens = 3 }\nmax-model-len = 4096\n'
                            '[server.env]\nHF_TOKEN = { from_env = "HF_TOKEN" }\nA = "1"\n',
        "p.toml": 'extends = "base.toml"\n[server.args]\nspeculative-config = { method = "ngram", '
                  'num_speculative_tokens = 4, prompt_lookup_max = 4 }\n[server.env]\nB = "2"\n',
    })
    assert p.server.flags.value("speculative-config") == JsonTable(
        '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}')
    assert p.server.flags.speculative.model is None and p.server.flags.value("max-model-len") == 4096
    assert p.plain_env() == {"A": "1", "B": "2"} and list(p.secrets) == ["HF_TOKEN"]  # sections merge
    assert tomllib.loads(p.resolved_toml)["server"]["args"]["speculative-config"] == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


@pytest.mark.parametrize("args, served, key", [
    ('served-model-name = "a"\napi-key = "k"\n', "a", "k"),
    ('served_model_name = "a"\napi_key = "k"\n', "a", "k"),      # vLLM takes either spelling
    ('served_model_name = ["a", "b"]\napi_key = ["k", "l"]\n', "a", "k"),  # the first of several
    ("", "/m", None),                                                # vLLM's default: the model
])
def test_served_name_and_api_key_in_either_spelling(tmp_path, args, served, key):
    p = load(tmp_path, {"p.toml": VLLM + "[server.args]\n" + args})
    assert (p.served_name, p.api_key) == (served, key)


def test_api_key_from_the_environment_variable_vllm_reads(tmp_path):
    p = load(tmp_path, {"p.toml": VLLM + '[server.env]\nVLLM_API_KEY = { from_env = "HF_TOKEN" }\n'})
    assert p.api_key == ENV["HF_TOKEN"]
    assert load(tmp_path, {"p.toml": VLLM + '[server.env]\nVLLM_API_KEY = "plain"\n'}).api_key == "plain"


def test_profile_records_are_frozen_and_hashable_and_a_secret_repr_hides_its_value(tmp_path):
    import dataclasses
    p = load(tmp_path, {"p.toml": VLLM + '[server.args]\nx = { a = 1 }\n'})
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.server.port = 1
    assert hash(p.server) == hash(load_profile(tmp_path / "p.toml", environ=ENV).server)
    moved = dataclasses.replace(p.server, args=(("served_model_name", "n"),))
    assert moved.flags.served_model_name == "n"  # the flags are read again for the copy
    s = Secret("HF_TOKEN", "hf_supersecret")
    assert repr(s) == "Secret(source='HF_TOKEN', value=...)" and str(s) == "<secret from $HF_TOKEN>"
    assert s.value == "hf_supersecret" and "hf_supersecret" not in repr(Secret("A", "hf_supersecret"))


def test_defaults(tmp_path):
    p = load(tmp_path, {"p.toml": VLLM})
    assert (p.target.hosts, p.target.name, p.target.workdir, p.target.keep_releases) == ((), "p", "~/llmfab", 5)
    assert (p.server.host, p.server.port, p.server.python, p.server.command) == ("0.0.0.0", 8000, None, ())
    assert (p.ready.timeout, p.ready.poll_interval, p.ready.health_path, p.ready.models_path) == (
        1800.0, 1.0, "/health", "/v1/models")
    assert p.gpu.devices is None and p.gpu.min_free_mib == 0 and p.gpu.nvidia_smi == "nvidia-smi"
    assert p.cluster is None and p.served_name == "/m" and p.path == (tmp_path / "p.toml").resolve()


def test_arg_types_are_kept(tmp_path):
    p = load(tmp_path, {"p.toml": VLLM + '[server.args]\ni = 2\nf = 0.92\nb = true\nn = false\ns = "x"\n'
                                           'a = ["q", 1, 1.5, false]\n'})
    args = dict(p.server.args)
    assert [type(args[k]) for k in "ifbnsa"] == [int, float, bool, bool, str, tuple]
    assert args["a"] == ("q", 1, 1.5, False)


def test_compact_json_keeps_written_order(tmp_path):
    p = load(tmp_path, {"p.toml": VLLM + '[server.args]\nspeculative-config = { z = 1, a = "ü", m = '
                                           '[1, { k = 2.5 }], n = {} }\n'
                                           'compilation-config = \'{ "level" : 3, "b": [ 1 ] }\'\n'
                                           'hf_overrides = "3"\n'})
    args = dict(p.server.args)
    assert args["speculative-config"].text == '{"z":1,"a":"ü","m":[1,{"k":2.5}],"n":{}}'
    assert args["compilation-config"] == JsonTable('{"level":3,"b":[1]}')
    assert args["hf_overrides"] == "3"  # valid JSON, not an object: passed as written


def test_env_conversions_and_secret(tmp_path):
    p = load(tmp_path, {"p.toml": VLLM + '[server.env]\nS = "x"\nI = 8\nF = 0.5\nT = true\nN = false\n'
                                           'HF_TOKEN = { from_env = "HF_TOKEN" }\n'})
    env = dict(p.server.env)
    assert {k: env[k] for k in "SIFTN"} == {"S": "x", "I": "8", "F": "0.5", "T": "1", "N": "0"}
    assert env["HF_TOKEN"] == Secret(source="HF_TOKEN", value=ENV["HF_TOKEN"])
    assert p.secrets == {"HF_TOKEN": env["HF_TOKEN"]}


def test_secret_is_redacted_everywhere(tmp_path):
    p = load(tmp_path, {"p.toml": VLLM + '[server.env]\nHF_TOKEN = { from_env = "HF_TOKEN" }\n'})
    assert ENV["HF_TOKEN"] not in p.resolved_toml
    assert ENV["HF_TOKEN"] not in repr(p) and ENV["HF_TOKEN"] not in str(p.secrets["HF_TOKEN"])
    assert tomllib.loads(p.resolved_toml)["server"]["env"] == {"HF_TOKEN": {"from_env": "HF_TOKEN"}}


def test_resolved_toml_round_trips_and_stands_alone(tmp_path):
    p = load(tmp_path, {
        "lib/base.toml": VLLM + 'files = ["helper.py"]\n[server.args]\nq = "a\\"b\\\\c\\td\\u007f"\n'
                              '"we.ird" = 1e300\nneg = -0.0\n',
        "lib/helper.py": "print('hi')\n",
        "p.toml": 'extends = "lib/base.toml"\n[server.env]\nHF_TOKEN = { from_env = "HF_TOKEN" }\n',
    })
    # The helper is found beside the base profile that named it, not beside p.toml.
    assert p.server.files == (str((tmp_path / "lib/helper.py").resolve()),)
    data = tomllib.loads(p.resolved_toml)
    assert data["target"]["name"] == "p" and data["server"]["args"]["q"] == 'a"b\\c\td\x7f'
    (tmp_path / "elsewhere").mkdir()
    copy = tmp_path / "elsewhere" / "profile.toml"
    copy.write_text(p.resolved_toml, encoding="utf-8")
    again = load_profile(copy, environ=ENV)
    assert (again.target, again.server, again.ready, again.gpu) == (p.target, p.server, p.ready, p.gpu)
    assert again.resolved_toml == p.resolved_toml and again.digest == p.digest
    assert len(p.digest) == 64


def test_command_engine(tmp_path):
    p = load(tmp_path, {"p.toml": '[server]\nengine = "command"\ncommand = ["/bin/srv", ""]\n'
                                   '[server.args]\nworkers = 1\n'})
    assert p.server.command == ("/bin/srv", "") and p.server.model is None and p.served_name is None


# --- shipped configs ---------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    p = load_profile(path, environ={})  # shipped configs must not need any exported variable
    assert tomllib.loads(p.resolved_toml)


def test_dflash_config_renders_exact_json():
    p = load_profile(CONFIGS / "qwen3.6-27b-dflash.toml", environ={})
    assert p.target.name == "qwen36-dflash" and p.server.port == 30000
    assert p.server.flags.value("speculative-config") == JsonTable(
        '{"method":"dflash","model":"/root/models/Qwen3.6-27B-DFlash","num_speculative_tokens":15}')
    assert p.plain_env()["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert p.server.flags.value("tensor-parallel-size") == 2 and p.served_name == "qwen3.6-27b"


def test_two_node_profile_loads(tmp_path):
    # What configs/qwen3.6-27b-2node.toml would hold: the base plus a Ray cluster.
    p = load(tmp_path, {"p.toml": f'extends = "{CONFIGS / "qwen3.6-27b.toml"}"\n[target]\nname = '
                                   '"qwen36-2node"\n[server.args]\ntensor-parallel-size = 2\n'
                                   'pipeline-parallel-size = 2\n[cluster]\nbackend = "ray"\nworkers = '
                                   '["root@gpu-box-2"]\nray_port = 6380\nhead_address = "10.0.0.1"\n'})
    assert p.cluster.workers == ("root@gpu-box-2",) and p.cluster.ray_port == 6380
    assert p.cluster.backend == "ray" and p.cluster.head_address == "10.0.0.1"


# --- which profile a task uses -----------------------------------------------------------

def test_resolve_profile_path(tmp_path):
    write(tmp_path, {"mine.toml": VLLM, "configs/demo.toml": VLLM})
    assert resolve_profile_path("mine.toml", "x.toml", cwd=tmp_path) == tmp_path / "mine.toml"
    assert resolve_profile_path(None, "mine.toml", cwd=tmp_path) == tmp_path / "mine.toml"
    assert resolve_profile_path(None, None, cwd=tmp_path) == tmp_path / "configs/demo.toml"
    with pytest.raises(ProfileError, match="--profile"):
        resolve_profile_path("nope.toml", None, cwd=tmp_path)


def test_default_profile_falls_back_to_the_repo(tmp_path):
    shipped = REPO / "configs" / "demo.toml"
    if shipped.is_file():
        assert find_default_profile(cwd=tmp_path) == shipped
    else:
        with pytest.raises(ProfileError, match="--profile"):
            find_default_profile(cwd=tmp_path)


# --- the TOML writer and fuzzing -----------------------------------------------------------

scalars = st.one_of(st.text(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                    st.floats(allow_nan=False))
toml_data = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), toml_data, max_size=5))
def test_toml_writer_round_trips(data):
    def ordered(x):  # dict equality ignores key order, but order is argv order for [server.args]
        if isinstance(x, dict):
            return [(k, ordered(v)) for k, v in x.items()]
        return [ordered(v) for v in x] if isinstance(x, list) else x

    assert ordered(tomllib.loads(dumps(data))) == ordered(data)


def test_toml_writer_keeps_key_order():
    data = {"args": {"a": {"x": 1}, "b": 2, "c": {"y": {}}}}
    assert list(tomllib.loads(dumps(data))["args"]) == ["a", "b", "c"]


def test_toml_writer_special_floats():
    back = tomllib.loads(dumps({"a": math.inf, "b": -math.inf, "c": math.nan}))
    assert back["a"] == math.inf and back["b"] == -math.inf and math.isnan(back["c"])




def _fuzz(tmp_dir, docs):
    counter = {"examples": 0, "loaded": 0}

    @settings(max_examples=300, deadline=None)
    @given(docs)
    def run(texts):
        counter["examples"] += 1
        write(tmp_dir, {"p.toml": texts[0], "b.toml": texts[1], "x.py": ""})
        try:
            p = load_profile(tmp_dir / "p.toml", environ=ENV)
        except ProfileError:
            return
        counter["loaded"] += 1
        assert ENV["HF_TOKEN"] not in p.resolved_toml
        # The saved profile stands alone: loading it again gives the same profile and digest.
        write(tmp_dir, {"saved.toml": p.resolved_toml})
        again = load_profile(tmp_dir / "saved.toml", environ=ENV)
        assert (again.server, again.target, again.digest) == (p.server, p.target, p.digest)

    run()
    print(f"\nfuzz: {counter['examples']} examples, {counter['loaded']} loaded")
    assert counter["examples"] > 0


def test_fuzz_arbitrary_text_is_profile_error_or_profile(tmp_path):
    _fuzz(tmp_path, st.tuples(st.text(), st.text()))


def test_fuzz_args_and_env_tables_are_profile_error_or_profile(tmp_path):
    # Any TOML-expressible [server.args] / [server.env]: converted, or refused with a ProfileError.
    args = st.dictionaries(st.sampled_from(KEYS[25:30]) | st.text(max_size=6), toml_data, max_size=4)
    env = st.dictionaries(st.sampled_from(["A", "HF_TOKEN", "1x"]), toml_data, max_size=3)
    doc = st.tuples(args, env).map(lambda ae: dumps(
        {"server": {"engine": "vllm", "model": "/m", "args": ae[0], "env": ae[1]}}))
    _fuzz(tmp_path, st.tuples(doc, st.just("")))


def test_fuzz_tomlish_documents_are_profile_error_or_profile(tmp_path):
    head = st.sampled_from(["", 'extends = "b.toml"\n', 'extends = "p.toml"\n', 'extends = "nope"\n'])
    doc = st.tuples(head, tomlish).map("".join)
    _fuzz(tmp_path, st.tuples(doc.map(lambda d: d if "extends" in d else VLLM + d), doc))

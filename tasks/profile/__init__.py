"""The deployment profile: TOML in, one frozen `Profile` out (exit 2 on anything wrong).

    load.py       read the `extends` chain, merge, validate, keep the merged TOML text
    schema.py     the tables and keys a profile may have, built into the types below
    args.py       `[server.args]` and `[server.env]` values: flags, JSON tables, secrets
    readers.py    the checker that names the file, key path and what was expected
    types.py      the frozen records (Profile, Server, Target, Ready, Gpu, Cluster, ...)
    serverargs.py [server.args] read once (Server.flags): lookup by any spelling, dotted keys,
                  the speculative config, served name, API key, model paths
    toml_text.py  TOML writer for the saved profile.toml
"""
from .load import (DEFAULT_PROFILE, find_default_profile, load_profile,  # noqa: F401
                   resolve_profile_path, tomllib)

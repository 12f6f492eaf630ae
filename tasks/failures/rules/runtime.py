"""Failure rules in the words of what the engines run on: CPython (argparse,
multiprocessing), PyTorch/CUDA, NCCL, sockets, huggingface_hub and transformers.

Each pattern names the library version(s) and file its wording was read in.
"""
from ..host.records import Pattern, Rule

PROG = r"^(?P<prog>[\w.-]+(?: [\w.-]+)?): error: "   # argparse prints "%(prog)s: error: %(message)s"

RULES = (
    Rule(
        "spawn-main-guard", "launch script lacks the __main__ guard", 90,
        "the server's script starts processes at import time: under multiprocessing \"spawn\" each "
        "child re-imports it and tries to start its own children",
        "put the script's start-up under `if __name__ == \"__main__\":` (in {script}); llmfab's own "
        "launch.py already does this",
        (Pattern(r"An attempt has been made to start a new process before(?: the)?$|An attempt has been "
                 r"made to start a new process before the current process has finished its "
                 r"bootstrapping phase",
                 "CPython 3.4-3.14 Lib/multiprocessing/spawn.py _check_not_importing_main (the message "
                 "starts on the line after 'RuntimeError:'; 3.12+ adds 'To fix this issue, refer to ...'); seen in "
                 "vLLM 0.32.0 (CPU build), whose CPU platform starts its engine with spawn, under a "
                 "launcher that calls the API server's main() at import"),)),
    Rule(
        "unrecognized-arguments", "unknown flag", 85,
        "the engine does not know {args}",
        "remove or rename {args} in [server.args]: this engine version has no such flag (the host's "
        "`--help` lists the flags it has)",
        (Pattern(PROG + r"unrecognized arguments: (?P<args>.+)$",
                 "CPython 3.x Lib/argparse.py parse_args ('unrecognized arguments: %s'); vLLM's "
                 "FlexibleArgumentParser and SGLang keep it; seen in vLLM 0.32.0 (CPU build) as "
                 "'api_server.py: error: ...' (its positional model_tag takes a flag's value)"),)),
    Rule(
        "argparse-error", "the engine rejected its arguments", 80,
        "{prog} rejected its arguments: {message}",
        "correct that value in [server.args] ({message})",
        (Pattern(PROG + r"(?P<message>argument (?P<flag>[\w/-]+): Value (?P<value>.*) cannot be converted "
                 r"to <function loads.*)$",
                 "vLLM 0.8-0.33 vllm/utils/argparse_utils.py (a --speculative-config JSON split "
                 "into several arguments by a shell)",
                 fix="pass {flag} as ONE argv element of JSON: write it as a TOML table in [server.args] "
                     "(llmfab renders it as compact JSON, no shell in between)"),
         Pattern(PROG + r"(?P<message>.+)$",
                 "CPython 3.x Lib/argparse.py ArgumentParser.error ('%(prog)s: error: %(message)s', exit 2)"))),
    Rule(
        "torch-package-mismatch", "a torch extension package built for another torch", 87,
        "{package} cannot load against this environment's torch{torch_have}: it was built for "
        "another one{torch_wanted}",
        "{torch_package_fix}",
        (Pattern(r"operator (?P<package>torchvision|torchaudio|torchcodec)::\w+ does not exist",
                 "torchvision 0.1x-0.2x torchvision/_meta_registrations.py (its C++ operators never "
                 "registered: the extension failed to load); seen in vLLM 0.32.0 (CPU build) with "
                 "PyPI's CUDA torchvision 0.28.0 beside torch 2.13.0+cpu, imported by transformers"),
         Pattern(r"Could not load this library: \S*/(?P<package>torchaudio|torchvision|torchcodec)/\S+\.so",
                 "torchaudio 2.x torchaudio/_extension/utils.py (after torchvision was removed, in the "
                 "same install)"),
         Pattern(r"(?P<lib>lib(?:c10|torch)_cuda\.so): cannot open shared object file",
                 "the dynamic loader's error for a CUDA build of an extension package beside a CPU "
                 "torch (e.g. torchvision's _C.so or image.so needs libc10_cuda.so)"))),
    Rule(
        "cuda-oom", "CUDA out of memory", 70,
        "the GPU ran out of memory{alloc_text}",
        "{memory_knobs}, or free the GPU of other processes (`{fab_dry}`)",
        (Pattern(r"CUDA out of memory\. Tried to allocate (?P<alloc>[\d.]+ [KMG]iB)(?:\. GPU (?P<gpu>\d+)"
                 r"| \(GPU (?P<gpu_old>\d+))?",
                 "PyTorch c10/cuda/CUDACachingAllocator.cpp (2.1+: 'GPU N has a total capacity of ...'; "
                 "1.x-2.0: '(GPU N; X total capacity; ...'), raised as torch.OutOfMemoryError (2.5+) "
                 "or torch.cuda.OutOfMemoryError"),
         Pattern(r"(?P<alloc>)torch\.(?:cuda\.)?OutOfMemoryError",
                 "PyTorch torch/cuda/__init__.py, torch/__init__.py (the exception's name alone)"),
         Pattern(r"(?P<alloc>)CUDA error: out of memory",
                 "the CUDA runtime's cudaErrorMemoryAllocation text, as PyTorch 2.8+ raises it outside its "
                 "caching allocator (torch.AcceleratorError); seen in vLLM 0.26.0 on an H200 (torch "
                 "2.11.0+cu130) with 300 MiB of the GPU free"))),
    Rule(
        "no-kernel-image", "engine build lacks kernels for this GPU", 78,
        "the installed engine/PyTorch build has no CUDA kernels for this GPU{gpu_name}",
        "install a vLLM/PyTorch build compiled for this GPU's compute capability (newer GPUs, "
        "e.g. Blackwell sm_120, need a wheel built with a recent CUDA)",
        (Pattern(r"no kernel image is available for execution on the device",
                 "CUDA runtime cudaErrorNoKernelImageForDevice text, as PyTorch raises it "
                 "('CUDA error: ...', RuntimeError or torch.AcceleratorError in 2.8+)"),)),
    Rule(
        "port-in-use", "port already in use", 75,
        "port {port} is already taken on the host{zmq_note}",
        "{port_fix}",
        (Pattern(r"\[Errno 98\] error while attempting to bind on address \('(?P<addr>[^']*)', (?P<port>\d+)\)",
                 "CPython 3.x Lib/asyncio/base_events.py create_server (uvicorn, SGLang)"),
         Pattern(r"ZMQError: Address already in use(?: \(addr='(?P<zmq_addr>[^']*)'\))?",
                 "pyzmq 22-26 zmq/error.py ZMQError (23+ adds the address); vLLM's engine sockets"),
         Pattern(r"\[Errno 98\] Address already in use",
                 "CPython 3.x OSError for EADDRINUSE on Linux (vLLM's create_server_socket bind; the "
                 "port is not in the line: the cause names the profile's); seen in vLLM 0.32.0 (CPU build)"))),
    Rule(
        "nccl-error", "NCCL/Gloo communication failed", 60,
        "the GPUs' collective communication failed: {detail}",
        "run again with [server.env] NCCL_DEBUG = \"INFO\" to see why; on several nodes set "
        "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME to the interface that links them; in containers "
        "give enough /dev/shm",
        (Pattern(r"NCCL error: (?P<detail>.+)$",
                 "vLLM 0.4-0.33 vllm/distributed/device_communicators/pynccl_wrapper.py NCCL_CHECK; "
                 "SGLang srt/distributed/device_communicators/pynccl_wrapper.py"),
         Pattern(r"NCCL error in: (?P<detail>.+)$",
                 "PyTorch torch/csrc/distributed/c10d/NCCLUtils.hpp (DistBackendError)"),
         Pattern(r"Gloo connectFullMesh failed(?P<detail>.*)$",
                 "PyTorch third_party/gloo (ProcessGroupGloo)"))),
    Rule(
        "hf-gated-repo", "gated Hugging Face repository", 86,
        "the model {repo} is gated on Hugging Face and this server's token cannot read it",
        "{hf_token_fix}",
        (Pattern(r"Cannot access gated repo for url (?P<url>https?://\S+?)\.?$",
                 "huggingface_hub 0.14-1.x huggingface_hub/utils/_http.py hf_raise_for_status (GatedRepoError)"),
         Pattern(r"Access to model (?P<repo>\S+) is restricted",
                 "huggingface_hub 0.2x-1.x huggingface_hub/utils/_http.py (401 / 403 wording)"),
         Pattern(r"You are trying to access a gated repo\.",
                 "transformers 4.3x-4.5x src/transformers/utils/hub.py cached_files (OSError)"),
         Pattern(r"Make sure to have access to it at https://huggingface\.co/(?P<repo>\S+?)\.?$",
                 "transformers 4.3x-4.5x src/transformers/utils/hub.py (second line of the gated OSError)",
                 after=r"You are trying to access a gated repo"))),
    Rule(
        "hf-repo-not-found", "model not found on the Hub", 80,
        "{model} is neither a directory on the host nor a model id the Hub has",
        "check `server.model` (now {profile_model}): an absolute path that exists on the host, or a "
        "Hub id spelled `org/name`; for a private repo set [server.env] HF_TOKEN = {{ from_env = \"HF_TOKEN\" }}",
        (Pattern(r"(?:(?<=\s)|^)(?P<model>\S+) is not a local folder and is not a valid model identifier "
                 r"listed on",
                 "transformers 4.x src/transformers/utils/hub.py cached_files (OSError)"),
         Pattern(r"Repository Not Found for url: (?P<model>\S+?)\.?$",
                 "huggingface_hub 0.1x-1.x huggingface_hub/utils/_http.py (RepositoryNotFoundError)"))),
    Rule(
        "model-not-found", "model is neither a directory nor a Hub id", 79,
        "{model} is not a directory on the host, and not a Hugging Face Hub id either (the engine "
        "tried it as one)",
        "{model_fix}",
        (Pattern(r"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '(?P<model>[^']*)'",
                 "huggingface_hub 0.2x-1.x huggingface_hub/utils/_validators.py validate_repo_id "
                 "(HFValidationError, then transformers' OSError with the same text); seen in vLLM 0.32.0 "
                 "(CPU build) for a model path that does not exist"),
         Pattern(r"Repo id must use alphanumeric chars.*: '(?P<model>[^']*)'\.?$",
                 "huggingface_hub 0.2x-1.x huggingface_hub/utils/_validators.py validate_repo_id "
                 "(a relative path with one '/', or spaces)"),
         Pattern(r"Invalid repository ID or local directory specified: '(?P<model>[^']*)'",
                 "vLLM 0.9-0.33 vllm/transformers_utils/config.py get_config (wraps the hub's error)"))),
)

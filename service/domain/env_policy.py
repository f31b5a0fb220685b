"""Which environment variables a plan may set for vLLM.

What runs on a node is the node's choice: the executable is configured on the node (``preflight agent run
--vllm``), and a plan's ``env`` must not change which binary, loader or interpreter runs (``PATH``, ``LD_PRELOAD``,
``PYTHONPATH``, …). A plan's variables are allowed only by name prefix (an allowlist, so a loader or interpreter
variable nobody listed is refused too); the service refuses the plan (422, rule ``env_not_allowed``) and the agent
refuses to run one (reason ``env_not_allowed``).
"""

from __future__ import annotations

import re
from typing import Any

# Allowed: a name equal to one of these, or starting with one ending in "_".
ALLOWED_PREFIXES = (
    "VLLM_",
    "NCCL_",
    "CUDA_",
    "HF_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TRITON_",
    "NVIDIA_",
    "CUBLAS_",
    "CUDNN_",
    "GLOO_",
    "UCX_",
    "NVTE_",
    "TOKENIZERS_PARALLELISM",
    "TRANSFORMERS_OFFLINE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)
# Named in the refusal for a clearer message (they are refused by the allowlist anyway).
DENIED = re.compile(
    r"^(PATH|LD_.*|PYTHON.*|DYLD_.*|PERL5?LIB|PERL5OPT|RUBYLIB|RUBYOPT|NODE_OPTIONS|BASH_ENV|ENV|"
    r"SHELL|SHELLOPTS|IFS|HOME|TMPDIR|GCONV_PATH|MALLOC_.*|GLIBC_TUNABLES|HOSTALIASES|LOCPATH|"
    r"NLSPATH|SSL_CERT_.*|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|.*_PROXY|.*_proxy)$"
)
# Some variables under an allowed prefix still name a path the process loads code from.
# Any of them that names a place code, libraries, binaries or weights come from (paths, homes, roots, cache
# directories, plugins, modules, library and injection hooks, hub endpoints): CUDA_INJECTION64_PATH,
# TRITON_PTXAS_PATH, NCCL_NET_PLUGIN, HF_HOME, HF_ENDPOINT, UCX_MODULE_DIR, VLLM_CACHE_ROOT, TORCH_HOME, …; and any that
# names a module:class to import (TRITON_CACHE_MANAGER, TRITON_REMOTE_CACHE_BACKEND) or a command to run
# (UCX_GDB_COMMAND).
DENIED_ALLOWED = re.compile(
    r"^(TORCHINDUCTOR_CACHE_DIR|TRITON_CACHE_DIR|VLLM_PLUGINS|CUDA_CACHE_PATH|HF_MODULES_CACHE|TORCH_EXTENSIONS_DIR|"
    r"VLLM_USE_MODELSCOPE|TRITON_CACHE_MANAGER|TRITON_REMOTE_CACHE_BACKEND|[A-Z0-9]+_.*(COMMAND|CMD)|"
    r"[A-Z0-9]+_.*(PATH|PATHS|HOME|DIR|DIRS|ROOT|PLUGIN|PLUGINS|ENDPOINT|URL|LIB|LIBS|LIBRARY|MODULE|MODULES|"
    r"CACHE|INJECTION[A-Z0-9_]*|FILE)|[A-Z0-9_]*INJECTION[A-Z0-9_]*)$"
)


def _allowed(name: str) -> bool:
    if DENIED.match(name) or DENIED_ALLOWED.match(name):
        return False
    return any(name == p or (p.endswith("_") and name.startswith(p)) for p in ALLOWED_PREFIXES)


def refused(env: dict[str, Any]) -> list[tuple[str, str]]:
    """``[(name, why)]`` for every variable of ``env`` a plan may not set (empty when all are allowed)."""
    out = []
    for name in sorted(env):
        if not isinstance(name, str) or not _allowed(name):
            why = (
                "it changes which executable, loader or interpreter runs"
                if isinstance(name, str) and DENIED.match(name)
                else "it names where code, libraries, binaries or weights come from (a path, home, cache, plugin, "
                "module or endpoint): the node decides that, not a plan"
                if isinstance(name, str) and DENIED_ALLOWED.match(name)
                else "it is not under an allowed prefix (" + ", ".join(ALLOWED_PREFIXES) + ")"
            )
            out.append((str(name), why))
    return out

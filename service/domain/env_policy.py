"""Which environment variables a plan may set for vLLM.

What runs on a node is the node's choice: the executable is configured on the node (``preflight agent run
--vllm``), and a plan's ``env`` must not change which binary, loader or interpreter runs (``PATH``, ``LD_PRELOAD``,
``PYTHONPATH``, …). A plan's variables are allowed only by name prefix (an allowlist, so a loader or interpreter
variable nobody listed is refused too), and, inside the allowlist, refused where the supported vLLM releases' own
source shows the value is imported, unpickled, written to or read from as a path, or turns a safety check off
(``loading`` in the generated catalogues; service/domain/loading.py). The service refuses the plan (422, rule
``env_not_allowed``) and the agent refuses to run one (reason ``env_not_allowed``). A variable the node sets for
itself is never overridden by a plan: the agent's own environment wins.
"""

from __future__ import annotations

import re
from typing import Any

from . import versions
from .loading import CODE, PLACES, POLICY, env_loads

# what a plan's env may not make the release do, in any environment (the node's env is the node's)
REFUSED_KINDS = CODE | PLACES | {"safety_off"}

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
# Variables of the libraries beside vLLM (torch, Triton, NCCL, CUDA, UCX, the Hub) that vLLM's source does not read
# and the analysis cannot see: by their documented meaning, any that names a place code, libraries, binaries or
# weights come from (CUDA_INJECTION64_PATH, TRITON_PTXAS_PATH, NCCL_NET_PLUGIN, HF_HOME, HF_ENDPOINT, UCX_MODULE_DIR,
# TORCH_HOME, …) or a command to run (UCX_GDB_COMMAND).
DENIED_ALLOWED = re.compile(
    r"^(TORCHINDUCTOR_CACHE_DIR|TRITON_CACHE_DIR|VLLM_PLUGINS|CUDA_CACHE_PATH|HF_MODULES_CACHE|TORCH_EXTENSIONS_DIR|"
    r"VLLM_USE_MODELSCOPE|[A-Z0-9]+_.*(COMMAND|CMD)|"
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
    allowed = {k: v for k, v in env.items() if isinstance(k, str) and _allowed(k)}
    for load in env_loads(allowed, versions.env_loading()):
        if load.kind in REFUSED_KINDS:  # the same words as for an engine argument (loading.POLICY)
            out.append((load.field.removeprefix("env."), f"the release {POLICY[load.kind][1]} ({load.site})"))
    return sorted(out)

"""Launches read from where they live: a ``vllm serve`` command line, shell scripts, Dockerfiles, compose files,
Kubernetes / LeaderWorkerSet / KServe manifests, production-stack Helm values and vLLM's own config YAML.

Every reader turns a file into ``FoundLaunch`` records: the argv as the process would receive it, each word with
the place in the file it came from, and what the file says about the hardware. One parse (``parse.py``) turns a
FoundLaunch into a launch request for the release's option table, so a finding can point at the line and column of
the flag that is wrong. ``resolve.py`` finds what the launch's MODEL word stands for (its config.json and small files,
from ``--models``, a directory, the Hugging Face cache or the Hub, as vLLM looks) and the hardware (the options, the
file's GPU label and count, else this machine's nvidia-smi)."""

"""``python -m service.cli``: how the agent boots itself again (agent/boot.py ``reexec_self``)."""

from . import main

main()

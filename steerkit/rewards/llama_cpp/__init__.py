"""Reward models on llama.cpp (backends ``llama.cpp`` and ``llama.cpp-q8``): see :mod:`.backend`, :mod:`.export`,
:mod:`.runtime`, :mod:`.model` (sequence rewards) and :mod:`.token` (token-level rewards)."""

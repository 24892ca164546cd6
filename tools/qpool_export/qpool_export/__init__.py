"""qpool_export: imports diffusers folders (sd, sdxl, flux, hidream) and writes tiny pipelines
with random weights as qpool model repository folders (docs/model-repository.md). Run `.venv/bin/qpool-export --help` (scripts/setup.sh
installs it; `python -m qpool_export` is the same)."""

__version__ = "0.1.0"

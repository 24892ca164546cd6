"""qpool_export: writes Stable-Diffusion-1.x-shaped pipelines (random weights) as qpool model
repository folders (docs/model-repository.md). Run `python -m qpool_export --help`."""

__version__ = "0.1.0"

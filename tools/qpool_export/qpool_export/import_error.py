"""The error of `from-diffusers`: what it cannot import, naming the file, the field and the
value (or the tensor), so that a user knows what to change."""


class ImportFailure(ValueError):
    """An input the importer cannot represent or a check it failed."""

"""The error of `from-diffusers`: what it cannot import, naming the file, the field and the
value (or the tensor), so that a user knows what to change."""


from typing import Sequence


class ImportFailure(ValueError):
    """An input the importer cannot represent or a check it failed."""


def check_weights_match(where: str, missing: Sequence[str], unexpected: Sequence[str]) -> None:
    """ImportFailure naming the folder and the first tensors qpool's module misses in the
    weights, or the weights hold that it has no place for."""
    if not missing and not unexpected:
        return
    parts = []
    for what, names in (("missing", missing), ("unexpected", unexpected)):
        if names:
            parts.append(f"{what} {', '.join(names[:5])}" + (" ..." if len(names) > 5 else ""))
    raise ImportFailure(f"{where}: the weights do not match the architecture its config "
                        f"describes: {'; '.join(parts)}")
